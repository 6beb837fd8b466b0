package redisstore

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/lock/lockdriver"
)

// lease is one acquisition. Its lifecycle is lockdriver.Control's; this type
// adds the two requests that touch Redis.
type lease struct {
	lockdriver.Control
	s     *Store
	owner string // the lock.WithOwner identity it was taken with, or ""
	hold  hold   // the Store's tenure of the key in Redis the lease is part of
	used  uint64 // which of the hold's leases this is, from 0: its fence is hold.fence + used

	// passed is set when the lease handed its hold on to a next lease, or
	// to the Store to keep (handoff.go): the token in Redis is no longer
	// this lease's to refresh or release. (A Refresh in flight when the
	// lease was released would otherwise release its successor's hold.)
	passed atomic.Bool
}

// hold is one tenure of a token of this Store on a key in Redis, which
// local hand-offs without a round trip pass from lease to lease.
type hold struct {
	fence  uint64    // the first fence Redis issued for the token (rediskit's fence.lua)
	fences uint64    // how many: the hold serves leases with fences fence … fence + fences − 1
	clock  int64     // the server's clock (µs) when it issued fence, or 0 when not known
	took   time.Time // when the Store learnt it took the key from Redis (WithMaxLocalHold counts from it)
	plain  bool      // taken by a first attempt, and not passed on since (rediskit.Base.Release)
}

// newLease returns a held lease whose local deadline is start + ttl:
// counted from before the request was sent, it never passes after the
// server's own expiry. fence is the first of the fences fences Redis
// issued, at clock (µs; 0 when not known).
func (s *Store) newLease(key, tok string, fence, fences uint64, clock int64, plain bool, start time.Time, ttl time.Duration, owner string) *lease {
	return s.makeLease(key, tok, hold{fence: fence, fences: fences, clock: clock, took: time.Now(), plain: plain}, 0, start.Add(ttl), owner)
}

// makeLease returns a held lease on h with fence h.fence + used (0 when
// the Store is unfenced).
func (s *Store) makeLease(key, tok string, h hold, used uint64, deadline time.Time, owner string) *lease {
	l := &lease{s: s, owner: owner, hold: h, used: used}
	fence := h.fence + used
	if s.unfenced {
		fence = 0
	}
	l.Init(lockdriver.Config{
		Driver: "redisstore", Key: key, Token: tok, Fence: fence,
		Deadline: deadline,
		Store:    l,
		OnEnd:    func(lockdriver.State) { s.leaseEnded(l) },
	})
	return l
}

// ended reports whether l has ended (released, lost, or its deadline
// passed). A lease whose deadline passed before its Store recorded it as
// the key's holder (a slow reply, a descheduled goroutine) must not be
// recorded: its end, which clears the record, has run already, and the
// stale record would make the key busy in this process for ever. Checked
// under the Store's lock: an end after the check clears the record it
// finds.
func (l *lease) ended() bool {
	select {
	case <-l.Done():
		return true
	default:
		return false
	}
}

// issued is the highest fence l's token handed out, for the release of a
// plain hold (rediskit.Base.Release): its take reserved more, which a
// hold passed on from lease to lease uses. 0 when unfenced.
func (l *lease) issued() uint64 {
	if l.s.unfenced || l.hold.fence == 0 {
		return 0
	}
	return l.hold.fence + l.used
}

// StoreRefresh implements lockdriver.Store: one round trip.
func (l *lease) StoreRefresh(ctx context.Context, ttl time.Duration) (time.Time, error) {
	if l.passed.Load() {
		return time.Time{}, fmt.Errorf("redisstore: refresh %q: %w", l.Key(), lock.ErrLockLost)
	}
	start := time.Now()
	ok, err := l.s.base.Refresh(ctx, l.s.client, l.Key(), l.Token(), ttl)
	switch {
	case err != nil:
		return time.Time{}, fmt.Errorf("redisstore: refresh %q: %w", l.Key(), err)
	case !ok:
		return time.Time{}, fmt.Errorf("redisstore: refresh %q: %w", l.Key(), lock.ErrLockLost)
	}
	return start.Add(ttl), nil
}

// StoreRelease implements lockdriver.Store: it hands the key to the next
// waiter of this Store (no round trip, or one), keeps it a moment for this
// Store's next Acquire (none), or deletes it and grants it to the first
// waiting process or wakes it (one).
func (l *lease) StoreRelease(ctx context.Context) error {
	if l.passed.Load() {
		return nil // released already: its hold went on
	}
	if done, err := l.s.handOff(ctx, l); done {
		return err
	}
	code, err := l.s.base.Release(ctx, l.s.client, l.Key(), l.Token(), false, 0, l.hold.clock, l.hold.plain, l.issued())
	if err == nil {
		l.s.recent.LetGo(l.Key())
	}
	switch {
	case err != nil:
		return fmt.Errorf("redisstore: release %q: %w", l.Key(), err)
	case !code.Ours():
		l.s.leaseEnded(l) // no longer ours: not this Store's holder either
		return fmt.Errorf("redisstore: release %q: %w", l.Key(), lock.ErrLockLost)
	}
	l.s.leaseEnded(l) // also when the local deadline had already ended it
	return nil
}

var _ lockdriver.Store = (*lease)(nil)

// public is l as its holder sees it: nil for no lease.
func (l *lease) public() lock.Lease {
	if l == nil {
		return nil
	}
	return l.Lease()
}
