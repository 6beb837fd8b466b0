package idemdriver

import (
	"context"
	"errors"
	"time"

	"github.com/oncekit/oncekit/core/internal/idemerr"
)

// State is what Begin found.
type State int

const (
	// Acquired: the caller owns the key and runs; the Claim carries its
	// token and fence.
	Acquired State = iota + 1
	// InFlight: another caller's run holds the key.
	InFlight
	// Completed: the key ran; Claim.Result holds the stored bytes.
	Completed
	// Mismatch: the key is taken by a request with another fingerprint.
	Mismatch
)

func (s State) String() string {
	switch s {
	case Acquired:
		return "acquired"
	case InFlight:
		return "in flight"
	case Completed:
		return "completed"
	case Mismatch:
		return "mismatch"
	}
	return "unknown"
}

// Claim is the answer of Store.Begin.
type Claim struct {
	// Key is the key Begin was asked for.
	Key   Key
	State State
	// Fingerprint is the fingerprint the claim was begun with.
	Fingerprint string
	// Token identifies an Acquired claim: Complete, Abandon and Extend
	// act only while it still holds the key.
	Token string
	// Fence is strictly greater than every earlier claim's on the key in
	// the store; pass it to writes the run makes (see lock.FenceGate).
	Fence uint64
	// Attempt numbers an Acquired claim among the key's claims: 1 for the
	// first, n+1 when the n claims before it ended without completing —
	// a lease that ran out (the process died or froze), an Abandon (the
	// run failed, panicked, or was given back) — as far as the store
	// remembers them: for AttemptMemory after each ended, and not past a
	// completion (a key claimed again after its retention starts at 1).
	// Over-counting is possible (a claim given back before its run
	// started counts), under-counting beyond the memory is not guarded:
	// a run on attempt > 1 asks the outside system what the earlier ones
	// did before acting again. 0 for any other State.
	Attempt int
	// Result is the stored bytes of a Completed claim.
	Result []byte
	// Expires is when an in-flight claim's lease, or a completed record's
	// retention, runs out (zero for a Completed claim whose driver answered
	// without reading the retention: redisstore's replay by one GET). For an Acquired claim it must be no later than
	// the store could let another caller claim the key, by this process's
	// clock (a driver whose claim also depends on a session says the
	// earlier of the two). The Guard ends its run's context by then, or by
	// the lease counted from before the Begin request was sent, whichever
	// comes first.
	Expires time.Time
}

// Store keeps idempotency records. The in-flight record is the lock: the
// first Begin writes it with a lease, duplicates read it. Implementations
// check the token atomically, so a holder whose lease ran out can never
// overwrite or delete a newer claim.
type Store interface {
	// Begin claims key for a request with fingerprint, or reports what
	// holds it: one round trip. The zero Key is refused with
	// ErrInvalidKey; any other was checked when it was made (Key).
	Begin(ctx context.Context, key Key, fingerprint string, ttl time.Duration) (Claim, error)
	// Complete stores result for retention, if c still holds the key
	// (else ErrLockLost): one round trip.
	Complete(ctx context.Context, c Claim, result []byte, retention time.Duration) error
	// Abandon deletes c's in-flight record so that a retry can run (else
	// ErrLockLost).
	Abandon(ctx context.Context, c Claim) error
	// Extend makes c valid for ttl from now (else ErrLockLost). On
	// success the key cannot be claimed by another caller before ttl has
	// passed from when the call began: the Guard counts its run's
	// validity from then.
	Extend(ctx context.Context, c Claim, ttl time.Duration) error
}

// Waiter is implemented by stores that can wake a duplicate when the key it
// waits for is completed or abandoned. Guard uses it to wait without
// polling; it returns when the key may have changed (the caller calls Begin
// again) or ctx ends.
type Waiter interface {
	WaitChange(ctx context.Context, key Key, until time.Time) error
}

// EffectStore is a Store that can commit a run's effect together with its
// record: one Redis script in the record's hash slot (redisstore.Effect),
// one etcd transaction (etcdstore.Effect), one critical section
// (memstore.Effect), one SQL transaction (sqlstore.Effect), one ZooKeeper
// multi-operation transaction (zkstore.Effect).
//
// Both are written, or neither: a process that dies after the run never
// leaves the effect done and the record in flight, so the retry that
// follows finds the record completed and replays it instead of applying
// the effect again.
type EffectStore interface {
	Store
	// CompleteWith is Complete with effect applied in the same atomic step.
	// An effect of another type than the driver's is ErrEffectUnsupported;
	// one whose own condition fails is an *EffectRefusedError, with
	// nothing written.
	CompleteWith(ctx context.Context, c Claim, result []byte, retention time.Duration, effect any) error
}

// CallerCommits is implemented by effects that the caller's own
// transaction commits after Guard.Do returns (sqlstore.InTx): the record
// is completed in that transaction, and only its commit makes the run's
// result stored.
type CallerCommits interface {
	CallerCommits()
}

// CorruptRecord is the error of a record a store cannot read: it matches
// idem.ErrCorruptRecord, names key, and says why (reason).
func CorruptRecord(key, reason string) error { return &idemerr.Corrupt{Key: key, Reason: reason} }

// CorruptRecordOf returns the key and the reason of a CorruptRecord error
// in err's chain.
func CorruptRecordOf(err error) (key, reason string, ok bool) {
	var c *idemerr.Corrupt
	if !errors.As(err, &c) {
		return "", "", false
	}
	return c.Key, c.Reason, true
}

// RetryAfter returns the hint an idem.ErrInFlight error carries: how long
// until the running claim's lease runs out.
func RetryAfter(err error) (time.Duration, bool) {
	var f *idemerr.InFlight
	if !errors.As(err, &f) {
		return 0, false
	}
	return f.RetryAfter, true
}
