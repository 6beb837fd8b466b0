package idem

import (
	"context"
	"errors"
	"sync"
	"time"
)

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

type effectKey struct{}

// CallerCommits is implemented by effects that the caller's own
// transaction commits after Guard.Do returns (sqlstore.InTx): the record
// is completed in that transaction, and only its commit makes the run's
// result stored.
type CallerCommits interface {
	CallerCommits()
}

// ErrCallerCommits refuses an effect that the caller commits
// (CallerCommits) in a run whose answer is released as soon as Guard.Do
// returns (AnswersOnReturn: httpmw, grpcmw, kafkamw, job.Run): the client would
// have its answer, or the message its offset, before the commit that
// makes it true, and a handler that commits the transaction itself
// commits its writes before the record, which then fails to complete.
// Commit the effect with the record instead (sqlstore.Effect: the
// Store's own transaction runs it and commits it with the record before
// the answer is released).
var ErrCallerCommits = errors.New("idem: an effect the caller's transaction commits (sqlstore.InTx) cannot be committed in a run that answers when its Guard.Do returns (the middlewares, job.Run); use the store's own transaction (sqlstore.Effect)")

type answersKey struct{}

// AnswersOnReturn marks ctx, passed to Guard.Do, as a run whose answer
// the caller releases as soon as Do returns — what the middlewares do:
// Commit inside the run then refuses effects the caller would commit
// later (ErrCallerCommits).
func AnswersOnReturn(ctx context.Context) context.Context {
	return context.WithValue(ctx, answersKey{}, true)
}

type outlivesKey struct{}

// ClaimTimeout bounds the request that claims a key under
// ClaimOutlivesCaller.
const ClaimTimeout = 5 * time.Second

// ClaimOutlivesCaller marks ctx, passed to Guard.Do, as a server's
// handling of a request: the one request to the store that claims the key
// is not cut short when ctx ends (the client hung up, or its deadline
// passed), only by ClaimTimeout and the store client's own timeouts. A
// store can then make it on the caller's goroutine (on Redis with
// ContextTimeoutEnabled: the hand-off to a background goroutine, which
// lets a caller leave at once, costs tens of microseconds a request on a
// busy machine). A claim taken for a caller that left meanwhile is given
// back before Do returns ctx's error, as it would be at once without the
// mark; waiting for a duplicate in flight still ends when ctx does.
// httpmw and grpcmw mark their requests so: when a client hangs up while
// the store is stalled, its handler returns once the store answers or
// times out, and nobody waits for that answer.
func ClaimOutlivesCaller(ctx context.Context) context.Context {
	return context.WithValue(ctx, outlivesKey{}, true)
}

func outlivesCaller(ctx context.Context) bool {
	v, _ := ctx.Value(outlivesKey{}).(bool)
	return v
}

// effectSlot holds the effect a run attached with Commit.
type effectSlot struct {
	mu     sync.Mutex
	effect any
	closed bool // the run returned
}

// Commit attaches effect to the completion of the Guard run that ctx
// belongs to (the context the Guard passed to the run): the Guard then
// stores the run's result with EffectStore.CompleteWith, so that the
// effect and the record commit together or not at all. The effect's type
// is the store driver's. A run attaches at most one effect, and only while
// it runs.
func Commit(ctx context.Context, effect any) error {
	slot, ok := ctx.Value(effectKey{}).(*effectSlot)
	switch {
	case !ok:
		return errors.New("idem: Commit outside a Guard's run")
	case effect == nil:
		return errors.New("idem: Commit of a nil effect")
	}
	if _, callerCommits := effect.(CallerCommits); callerCommits && ctx.Value(answersKey{}) != nil {
		return ErrCallerCommits
	}
	slot.mu.Lock()
	defer slot.mu.Unlock()
	switch {
	case slot.closed:
		return errors.New("idem: Commit after the run returned")
	case slot.effect != nil:
		return errors.New("idem: a run commits one effect")
	}
	slot.effect = effect
	return nil
}

// take closes the slot and returns its effect.
func (s *effectSlot) take() any {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return s.effect
}
