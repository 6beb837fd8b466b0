package redisstore

import (
	"context"
	"fmt"
	"time"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/lock/lockdriver"
)

// lease is one acquisition. Its lifecycle is lockdriver.Lease's; this type
// adds the two requests that touch Redis.
type lease struct {
	lockdriver.Lease
	s     *Store
	owner string // the lock.WithOwner identity it was taken with, or ""

	// The hold's fences: base is the last one Redis issued for the token,
	// which reserved the next Reserve (see rediskit's fence.lua); used of
	// them went to this lease and the ones of the same hold before it
	// (local hand-offs). The lease's fence is base + used.
	base, used uint64
}

// newLease returns a held lease whose local deadline is start + ttl:
// counted from before the request was sent, it never passes after the
// server's own expiry.
func (s *Store) newLease(key, tok string, fence uint64, start time.Time, ttl time.Duration, owner string) *lease {
	return s.makeLease(key, tok, fence, 0, start.Add(ttl), owner)
}

// makeLease returns a held lease on the hold tok with fence base + used.
func (s *Store) makeLease(key, tok string, base, used uint64, deadline time.Time, owner string) *lease {
	l := &lease{s: s, owner: owner, base: base, used: used}
	l.Lease.Init(lockdriver.Config{
		Driver: "redisstore", Key: key, Token: tok, Fence: base + used,
		Deadline: deadline,
		Store:    l,
		OnEnd:    func(lockdriver.State) { s.leaseEnded(l) },
	})
	return l
}

// StoreRefresh implements lockdriver.Store: one round trip.
func (l *lease) StoreRefresh(ctx context.Context, ttl time.Duration) (time.Time, error) {
	start := time.Now()
	ok, err := l.s.Refresh(ctx, l.s.client, l.Key(), l.Token(), ttl)
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
	if done, err := l.s.handOff(ctx, l); done {
		return err
	}
	code, err := l.s.Release(ctx, l.s.client, l.Key(), l.Token(), false)
	if err == nil {
		l.s.recent.LetGo(l.Key())
	}
	switch {
	case err != nil:
		return fmt.Errorf("redisstore: release %q: %w", l.Key(), err)
	case !code.Ours():
		return fmt.Errorf("redisstore: release %q: %w", l.Key(), lock.ErrLockLost)
	}
	l.s.leaseEnded(l) // also when the local deadline had already ended it
	return nil
}
