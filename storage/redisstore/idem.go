package redisstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/lock/lockdriver"
	"github.com/oncekit/oncekit/storage/internal/rediskit"
	"github.com/oncekit/oncekit/storage/internal/redisnotify"
	"github.com/oncekit/oncekit/storage/internal/token"
)

// Idempotency records (idemdriver.Store). A key K is stored as one string
// "<record prefix>{K}" — "R2|<state>|<fence>|<flags>|<token>|<fingerprint
// length>|<fingerprint><result>" (see rediskit's lua/claim.lua) — whose
// PTTL is the retention, or the lease + idem.AttemptMemory, and a channel "<record prefix>{K}:done"
// on which completion and abandonment are announced when a duplicate waits.
// Anything else under the record's name is reported as
// idem.ErrCorruptRecord, never read as absent.

// Begin implements idemdriver.Store in one round trip.
func (s *Store) Begin(ctx context.Context, key idemdriver.Key, fingerprint string, ttl time.Duration) (idemdriver.Claim, error) {
	if err := key.Check(); err != nil {
		return idemdriver.Claim{}, err
	}
	if err := lockdriver.ValidateTTL(ttl); err != nil {
		return idemdriver.Claim{}, err
	}
	if err := s.closedErr("begin", key.String()); err != nil {
		return idemdriver.Claim{}, err
	}
	if s.get != nil && s.replays.Load() > 0 {
		// Most recent Begins were replays (a burst of retries, a consumer
		// re-reading what it processed): one plain GET answers a replay,
		// without the script's work; anything else goes to the script.
		res, ok, err := s.base.LookCompleted(ctx, s.get, key, fingerprint)
		if err == nil && ok {
			s.seen(true)
			return idemdriver.Claim{Key: key, State: idemdriver.Completed, Fingerprint: fingerprint, Result: res}, nil
		}
		if ctx.Err() != nil {
			return idemdriver.Claim{}, fmt.Errorf("redisstore: begin %q: %w", key, ctx.Err())
		}
	}
	tok := token.New()
	now := time.Now()
	giveBack := func() { // a claim the caller will never use
		cctx, cancel := lockdriver.CleanupContext(ctx)
		defer cancel()
		_, _ = s.base.Finish(cctx, s.client, key, tok, rediskit.GiveBack, time.Millisecond, nil, 0)
	}
	r, err := s.base.Begin(ctx, s.client, key, fingerprint, tok, ttl, func(r rediskit.BeginReply) {
		if r.Code == rediskit.BeginClaimed {
			giveBack()
		}
	})
	if err != nil {
		switch {
		case errors.Is(err, rediskit.ErrNotReplicated):
			giveBack() // claimed, but not on enough replicas: given back before the call returns
		case ctx.Err() == nil && !rediskit.IsReply(err):
			s.base.BG.Go(giveBack) // the script may have run before the connection failed
		}
		return idemdriver.Claim{}, fmt.Errorf("redisstore: begin %q: %w", key, err)
	}
	s.seen(r.Code == rediskit.BeginCompleted)
	return r.Claim(key, fingerprint, tok, ttl, now)
}

// seen counts a Begin that found a completed record (replay) or not, into
// a score bounded to ±8: above 0, most recent Begins were replays, and the
// next one looks with a plain GET first (one round trip for a replay, two
// for anything else); otherwise it runs the begin script at once.
func (s *Store) seen(replay bool) {
	for {
		n := s.replays.Load()
		m := n - 1
		if replay {
			m = n + 1
		}
		if m < -8 || m > 8 || s.replays.CompareAndSwap(n, m) {
			return
		}
	}
}

// finish runs op on claim c in one round trip.
func (s *Store) finish(ctx context.Context, c idemdriver.Claim, op rediskit.FinishOp, d time.Duration, result []byte) error {
	ctx, cancel, err := rediskit.FinishContext(ctx, c, op, "redisstore")
	if err != nil {
		return err
	}
	defer cancel()
	ok, err := s.base.Finish(ctx, s.client, c.Key, c.Token, op, d, result, 0)
	switch {
	case err != nil:
		return fmt.Errorf("redisstore: %s %q: %w", op, c.Key, err)
	case !ok:
		return fmt.Errorf("redisstore: %s %q: %w", op, c.Key, lock.ErrLockLost)
	}
	return nil
}

// WaitChange implements idemdriver.Waiter: it subscribes to the record's channel,
// looks once more (the record may have changed before the subscription),
// and returns on the completion or abandonment message, at until (the
// lease's end), or when ctx ends.
func (s *Store) WaitChange(ctx context.Context, key idemdriver.Key, until time.Time) error {
	w, err := s.sub.Watch(ctx, s.base.Records.Channel(key))
	if errors.Is(err, redisnotify.ErrClosed) {
		return fmt.Errorf("redisstore: wait for %q: %w", key, lock.ErrClosed)
	}
	if err != nil {
		return err
	}
	defer s.sub.Unwatch(w)
	if st, err := s.base.RecordStatus(ctx, s.client, key); err != nil || st != "i" {
		return nil // gone, completed, or unreadable: the caller looks again
	}
	wait := time.Until(until) + time.Millisecond
	if !w.Subscribed() {
		wait = min(wait, 50*time.Millisecond)
	}
	t := time.NewTimer(max(wait, time.Millisecond))
	defer t.Stop()
	select {
	case <-w.Wake():
	case <-t.C:
	case <-s.sub.Closed():
		return fmt.Errorf("redisstore: wait for %q: %w", key, lock.ErrClosed)
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// Complete implements idemdriver.Store: the result is stored if c still holds
// the key (else lock.ErrLockLost), in one round trip.
func (s *Store) Complete(ctx context.Context, c idemdriver.Claim, result []byte, retention time.Duration) error {
	return s.fin.Complete(ctx, c, result, retention)
}

// Abandon implements idemdriver.Store: c's in-flight record is deleted so that a
// retry can run (else lock.ErrLockLost), in one round trip.
func (s *Store) Abandon(ctx context.Context, c idemdriver.Claim) error { return s.fin.Abandon(ctx, c) }

// Extend implements idemdriver.Store: c's lease is lengthened to lease from now
// (else lock.ErrLockLost), in one round trip.
func (s *Store) Extend(ctx context.Context, c idemdriver.Claim, ttl time.Duration) error {
	return s.fin.Extend(ctx, c, ttl)
}
