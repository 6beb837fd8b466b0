package memstore

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/lock/lockdriver"
)

// Effect is an in-process write that commits atomically with an
// idempotency record: the Store runs it under the lock that completes the
// record, so no duplicate sees the record completed without the effect or
// the effect without the record. It returns nil to go ahead, or an error
// to refuse (its message becomes the refusal's reason); it must not call
// the Store, and must leave nothing written when it refuses. Pass it to
// idem.Commit in a Guard's run (or httpmw.Commit in a handler).
type Effect func() error

// CompleteWith implements idemdriver.EffectStore.
func (s *Store) CompleteWith(ctx context.Context, c idemdriver.Claim, result []byte, retention time.Duration, effect any) error {
	if err := lockdriver.ValidateTTL(retention); err != nil {
		return err
	}
	e, ok := effect.(Effect)
	if f, isFunc := effect.(func() error); isFunc {
		e, ok = f, true
	}
	if !ok || e == nil {
		return fmt.Errorf("memstore: complete %q: %T is not a memstore.Effect: %w", c.Key, effect, idem.ErrEffectUnsupported)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r, err := s.ownLocked(c, "complete")
	if err != nil {
		return err
	}
	if err := s.fits(c, result); err != nil {
		return err // before the effect: nothing applied
	}
	if err := e(); err != nil {
		return &idem.EffectRefusedError{Key: c.Key.String(), Reason: err.Error()}
	}
	s.completeLocked(r, slices.Clone(result), retention)
	return nil
}

var _ idemdriver.EffectStore = (*Store)(nil)
