package lockdriver

import (
	"context"
	"time"

	"github.com/oncekit/oncekit/core/lock"
)

// Seal is what a driver's TryAcquire and Acquire return: the lease with
// exactly lock.Lease's methods, so that the driver's own (Lease's End and
// Init, a driver's StoreRefresh) cannot be reached by a type assertion on
// a value users hold. It passes err through, and a nil lease as nil.
func Seal(l lock.Lease, err error) (lock.Lease, error) {
	if l == nil {
		return nil, err
	}
	return &sealed{l}, err
}

// SealAll is Seal for the leases of a multi-key acquisition.
func SealAll(ls []lock.Lease, err error) ([]lock.Lease, error) {
	for i, l := range ls {
		if l != nil {
			ls[i] = &sealed{l}
		}
	}
	return ls, err
}

// sealed is a lease seen from outside its driver.
type sealed struct{ l lock.Lease }

func (s *sealed) Key() string                                          { return s.l.Key() }
func (s *sealed) Token() string                                        { return s.l.Token() }
func (s *sealed) Fence() uint64                                        { return s.l.Fence() }
func (s *sealed) Refresh(ctx context.Context, ttl time.Duration) error { return s.l.Refresh(ctx, ttl) }
func (s *sealed) Release(ctx context.Context) error                    { return s.l.Release(ctx) }
func (s *sealed) Done() <-chan struct{}                                { return s.l.Done() }
func (s *sealed) Deadline() time.Time                                  { return s.l.Deadline() }
