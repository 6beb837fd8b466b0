package main

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/oncekit/oncekit/core/lock"
)

// roundRobin spreads calls over several Lockers (clients of one server).
type roundRobin struct {
	lockers []lock.Locker
	next    atomic.Uint64
}

func (r *roundRobin) pick() lock.Locker {
	return r.lockers[r.next.Add(1)%uint64(len(r.lockers))]
}

func (r *roundRobin) TryAcquire(ctx context.Context, key string, ttl time.Duration) (lock.Lease, error) {
	return r.pick().TryAcquire(ctx, key, ttl)
}

func (r *roundRobin) Acquire(ctx context.Context, key string, ttl time.Duration) (lock.Lease, error) {
	return r.pick().Acquire(ctx, key, ttl)
}
