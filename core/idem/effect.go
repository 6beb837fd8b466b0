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
// (memstore.Effect). An SQL store takes the same shape with an effect of
// type func(*sql.Tx) error, run in the transaction that completes the
// record.
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
