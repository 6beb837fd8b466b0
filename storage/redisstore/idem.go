package redisstore

import (
	"context"
	"fmt"
	"time"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/internal/redislua"
	"github.com/oncekit/oncekit/internal/token"
)

// Idempotency records (idem.Store). A key K is stored as a hash
// "<record prefix>{K}" — {v = 1, s = in flight | completed, fp, t = token,
// f = fence, r = result} — whose PTTL is the lease or the retention, beside
// its fence counter "<record prefix>{K}:fence" and a channel
// "<record prefix>{K}:done" on which completion and abandonment are
// announced. Anything else under the record's name is reported as
// idem.ErrCorruptRecord, never read as absent.

func (s *Store) records() redislua.Records { return redislua.Records{Prefix: s.opts.recordPrefix} }

// Begin implements idem.Store in one round trip.
func (s *Store) Begin(ctx context.Context, key, fingerprint string, lease time.Duration) (idem.Claim, error) {
	if err := lock.Validate(key, lease); err != nil {
		return idem.Claim{}, err
	}
	tok := token.New()
	now := time.Now()
	r, err := redislua.ParseBegin(redislua.Run(ctx, &s.bg, s.client, redislua.IdemBegin,
		[]string{s.records().Record(key), s.records().Fence(key)}, nil, fingerprint, tok, lease.Milliseconds()))
	if err != nil {
		return idem.Claim{}, fmt.Errorf("redisstore: begin %q: %w", key, err)
	}
	c := idem.Claim{Key: key, Fingerprint: fingerprint, Expires: now.Add(time.Duration(r.N) * time.Millisecond)}
	switch r.Code {
	case 1:
		c.State, c.Token, c.Fence, c.Expires = idem.Acquired, tok, uint64(r.N), now.Add(lease)
	case 2:
		c.State = idem.InFlight
	case 3:
		c.State, c.Result = idem.Completed, r.Result
	case 4:
		c.State = idem.Mismatch
	case -2:
		return idem.Claim{}, &idem.CorruptRecordError{Key: key, Reason: r.Reason}
	default:
		return idem.Claim{}, fmt.Errorf("redisstore: begin %q: unexpected script reply code %d", key, r.Code)
	}
	return c, nil
}

func (s *Store) finish(ctx context.Context, c idem.Claim, op string, d time.Duration, result []byte) error {
	if c.Token == "" {
		return fmt.Errorf("redisstore: %s %q: %w", op, c.Key, idem.ErrLockLost)
	}
	if ctx.Err() != nil && op != "extend" {
		var cancel context.CancelFunc
		ctx, cancel = lock.CleanupContext(ctx)
		defer cancel()
	}
	ok, err := redislua.Run(ctx, &s.bg, s.client, redislua.IdemFinish, []string{s.records().Record(c.Key)}, nil,
		c.Token, op, d.Milliseconds(), result, s.records().Channel(c.Key), s.modeArg()).Int64()
	if err != nil {
		return fmt.Errorf("redisstore: %s %q: %w", op, c.Key, err)
	}
	if ok != 1 {
		return fmt.Errorf("redisstore: %s %q: %w", op, c.Key, idem.ErrLockLost)
	}
	return nil
}

// Complete implements idem.Store in one round trip.
func (s *Store) Complete(ctx context.Context, c idem.Claim, result []byte, retention time.Duration) error {
	if err := lock.ValidateTTL(retention); err != nil {
		return err
	}
	return s.finish(ctx, c, "complete", retention, result)
}

// Abandon implements idem.Store in one round trip.
func (s *Store) Abandon(ctx context.Context, c idem.Claim) error {
	return s.finish(ctx, c, "abandon", time.Millisecond, nil)
}

// Extend implements idem.Store in one round trip.
func (s *Store) Extend(ctx context.Context, c idem.Claim, lease time.Duration) error {
	if err := lock.ValidateTTL(lease); err != nil {
		return err
	}
	return s.finish(ctx, c, "extend", lease, nil)
}

// WaitChange implements idem.Waiter: it subscribes to the record's channel,
// looks once more (the record may have changed before the subscription),
// and returns on the completion or abandonment message, at until (the
// lease's end), or when ctx ends.
func (s *Store) WaitChange(ctx context.Context, key string, until time.Time) error {
	w, err := s.sub.Watch(ctx, s.records().Channel(key))
	if err != nil {
		return err
	}
	defer s.sub.Unwatch(w)
	st, err := s.client.HGet(ctx, s.records().Record(key), "s").Result()
	if err != nil || st != "i" {
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
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

var (
	_ idem.Store  = (*Store)(nil)
	_ idem.Waiter = (*Store)(nil)
)
