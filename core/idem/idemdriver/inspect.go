package idemdriver

import (
	"context"
	"time"
)

// RecordInfo is what a store holds for one idempotency key, for operators.
type RecordInfo struct {
	Key   string
	Found bool
	// State is InFlight or Completed when Found.
	State       State
	Fingerprint string
	// Token is the start of an in-flight claim's token (eight characters).
	Token string
	Fence uint64
	// Expires is when the in-flight lease or the completed record's
	// retention runs out.
	Expires time.Time
	// Stored is the completed record's bytes as the Guard stored them;
	// idem.RecordOutcome decodes them.
	Stored []byte
	// Corrupt says why a found record is not a valid one (see
	// idem.ErrCorruptRecord); DeleteRecord removes it.
	Corrupt string
	// Detail is driver-specific, free-form: for Redlock, how many nodes
	// agree.
	Detail string
}

// Inspector is implemented by every oncekit driver.
type Inspector interface {
	// InspectRecord reports key's record; a missing one is not an error
	// (Found false). Keys are the stored ones: see ScopedKey.
	InspectRecord(ctx context.Context, key string) (RecordInfo, error)
	// DeleteRecord deletes key's record, in flight or completed, so that
	// the next request with the key runs again; waiters are woken. A run
	// still in flight loses its claim: its Complete fails with
	// ErrLockLost. It reports whether there was a record.
	DeleteRecord(ctx context.Context, key string) (bool, error)
}

// Lister enumerates a store's records, for operators (oncectl record
// list: the claims stuck in flight, say). Every oncekit driver implements
// it.
type Lister interface {
	// ListKeys calls fn with the stored key of every record, in no
	// particular order, until fn returns false. Records written or
	// deleted meanwhile may or may not be seen; a key may be seen whose
	// record has just expired, or that the store keeps only to count a
	// later claim's Attempt (an abandoned claim, for AttemptMemory, on
	// ZooKeeper) — InspectRecord then finds none. It reads
	// the whole key space in pages: for an operator, not a request path.
	ListKeys(ctx context.Context, fn func(key string) bool) error
}
