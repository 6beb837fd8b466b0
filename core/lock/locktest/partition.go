package locktest

import (
	"context"
	"fmt"
	"runtime"
	"time"

	"github.com/oncekit/oncekit/core/lock"
)

func yield() { runtime.Gosched() }

// partitioned wraps a Locker whose leases, once acquired, can no longer
// reach the store: Refresh hangs until its context ends, as a request into
// a network partition does. The store itself expires the key.
type partitioned struct{ lock.Locker }

func (p partitioned) Acquire(ctx context.Context, key string, ttl time.Duration) (lock.Lease, error) {
	l, err := p.Locker.Acquire(ctx, key, ttl)
	if err != nil {
		return nil, err
	}
	return cutOff{l}, nil
}

func (p partitioned) TryAcquire(ctx context.Context, key string, ttl time.Duration) (lock.Lease, error) {
	l, err := p.Locker.TryAcquire(ctx, key, ttl)
	if err != nil {
		return nil, err
	}
	return cutOff{l}, nil
}

type cutOff struct{ lock.Lease }

func (c cutOff) Refresh(ctx context.Context, _ time.Duration) error {
	<-ctx.Done()
	return fmt.Errorf("locktest: refresh into a partition: %w", ctx.Err())
}
