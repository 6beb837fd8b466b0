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
}

// newLease returns a held lease whose local deadline is start + ttl:
// counted from before the request was sent, it never passes after the
// server's own expiry.
func (s *Store) newLease(key, tok string, fence uint64, start time.Time, ttl time.Duration, owner string) *lease {
	l := &lease{s: s, owner: owner}
	l.Lease.Init(lockdriver.Config{
		Driver: "redisstore", Key: key, Token: tok, Fence: fence,
		Deadline: start.Add(ttl),
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
// waiter of this Store, or deletes it and wakes the first waiting process,
// in one round trip either way.
func (l *lease) StoreRelease(ctx context.Context) error {
	if done, err := l.s.handOff(ctx, l); done {
		return err
	}
	code, err := l.s.Release(ctx, l.s.client, l.Key(), l.Token(), false)
	switch {
	case err != nil:
		return fmt.Errorf("redisstore: release %q: %w", l.Key(), err)
	case !code.Ours():
		return fmt.Errorf("redisstore: release %q: %w", l.Key(), lock.ErrLockLost)
	}
	l.s.leaseEnded(l) // also when the local deadline had already ended it
	return nil
}
