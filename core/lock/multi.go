package lock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// multiLocker is lockdriver.MultiLocker: a driver that takes several keys
// at once.
type multiLocker interface {
	AcquireAll(ctx context.Context, keys []string, ttl time.Duration) ([]Lease, error)
}

// AcquireAll takes every key in keys for ttl, all or nothing: an order that
// reserves several SKUs at once. Duplicates are dropped and the keys are
// taken in one canonical (byte-wise sorted) order, so two callers asking
// for overlapping sets can never deadlock each other; when a key cannot be
// taken (ctx ends while waiting, a server fails), the keys already taken
// are released before AcquireAll returns. Errors are those of
// Locker.Acquire.
func AcquireAll(ctx context.Context, l Locker, keys []string, ttl time.Duration) (MultiLease, error) {
	keys, err := canonicalKeys(keys)
	if err != nil {
		return nil, err
	}
	if err := checkTTL(ttl); err != nil {
		return nil, err
	}
	if ml, ok := l.(multiLocker); ok {
		leases, err := ml.AcquireAll(ctx, keys, ttl)
		if err == nil {
			return newMultiLease(leases), nil
		}
		if !errors.Is(err, errors.ErrUnsupported) {
			return nil, err
		}
	}
	leases := make([]Lease, 0, len(keys))
	for _, k := range keys {
		lease, err := l.Acquire(ctx, k, ttl)
		if err != nil {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
			defer cancel()
			for _, taken := range slices.Backward(leases) {
				_ = taken.Release(cctx)
			}
			return nil, fmt.Errorf("lock: acquire all: %q: %w", k, err)
		}
		leases = append(leases, lease)
	}
	return newMultiLease(leases), nil
}

// canonicalKeys validates keys and returns them de-duplicated in the order
// AcquireAll takes them.
func canonicalKeys(keys []string) ([]string, error) {
	if len(keys) == 0 {
		return nil, fmt.Errorf("%w: no keys", ErrInvalidKey)
	}
	out := slices.Clone(keys)
	for _, k := range out {
		if err := checkKey(k); err != nil {
			return nil, err
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// MultiLease holds several keys as one: it refreshes and releases them
// together, and its Done closes as soon as any of them is released or
// lost.
type MultiLease interface {
	Keys() []string
	// Leases returns the leases of the keys, in canonical key order.
	Leases() []Lease
	Key() string
	// Fence returns the fence of key, or 0 if key is not held.
	Fence(key string) uint64
	Deadline() time.Time
	Done() <-chan struct{}
	// Refresh extends every key to ttl. It returns the errors of the keys
	// that could not be refreshed, joined; any lost key makes it match
	// ErrLockLost.
	Refresh(ctx context.Context, ttl time.Duration) error
	// Release releases every key, in reverse order, and returns their
	// errors joined. Like Lease.Release it works with a cancelled ctx and
	// is safe to retry.
	Release(ctx context.Context) error
}

// multiLease implements MultiLease.
type multiLease struct {
	leases []Lease
	done   chan struct{}
	once   sync.Once
}

// newMultiLease joins leases, in the order given, into one handle.
func newMultiLease(leases []Lease) *multiLease {
	m := &multiLease{leases: leases, done: make(chan struct{})}
	for _, l := range leases {
		go func() {
			select {
			case <-l.Done():
				m.once.Do(func() { close(m.done) })
			case <-m.done:
			}
		}()
	}
	return m
}

func (m *multiLease) Leases() []Lease { return slices.Clone(m.leases) }

func (m *multiLease) Keys() []string {
	keys := make([]string, len(m.leases))
	for i, l := range m.leases {
		keys[i] = l.Key()
	}
	return keys
}

func (m *multiLease) Key() string { return strings.Join(m.Keys(), ",") }

func (m *multiLease) Fence(key string) uint64 {
	for _, l := range m.leases {
		if l.Key() == key {
			return l.Fence()
		}
	}
	return 0
}

func (m *multiLease) Deadline() time.Time {
	var d time.Time
	for _, l := range m.leases {
		if ld := l.Deadline(); d.IsZero() || ld.Before(d) {
			d = ld
		}
	}
	return d
}

func (m *multiLease) Done() <-chan struct{} { return m.done }

func (m *multiLease) Refresh(ctx context.Context, ttl time.Duration) error {
	errs := make([]error, len(m.leases))
	var wg sync.WaitGroup
	for i, l := range m.leases {
		wg.Go(func() { errs[i] = l.Refresh(ctx, ttl) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (m *multiLease) Release(ctx context.Context) error {
	var errs []error
	for _, l := range slices.Backward(m.leases) {
		errs = append(errs, l.Release(ctx))
	}
	return errors.Join(errs...)
}
