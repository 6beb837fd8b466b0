package idem

import (
	"context"
	"errors"
	"sync"

	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/internal/runflags"
)

type effectKey struct{}

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
	if _, callerCommits := effect.(idemdriver.CallerCommits); callerCommits && runflags.AnswersOnReturn(ctx) {
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
