package lock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"
)

// DefaultTTL is the lease TTL a Mutex uses unless WithTTL says otherwise.
const DefaultTTL = 10 * time.Second

// Hooks are callbacks a Mutex invokes as leases come and go, for metrics and
// logging. Every field is optional. Callbacks run on the goroutine that
// caused the event (the caller's or the watchdog's) and must not block.
type Hooks struct {
	// OnAcquire runs after every Lock attempt: err is nil on success, and
	// wait is how long the call took.
	OnAcquire func(key string, fence uint64, wait time.Duration, err error)
	// OnRefreshError runs when a watchdog refresh fails but the lease may
	// still be alive (a timeout, an unreachable server); the watchdog keeps
	// trying until the lease's TTL runs out.
	OnRefreshError func(key string, err error)
	// OnLost runs once when a held lease is lost before its Release.
	OnLost func(key string, fence uint64)
	// OnRelease runs after Release with the time the lease was held.
	OnRelease func(key string, held time.Duration, err error)
}

// MutexOption configures a Mutex.
type MutexOption func(*mutexOptions)

type mutexOptions struct {
	ttl   time.Duration
	hooks Hooks
}

// WithTTL sets the TTL of each lease. The watchdog refreshes it every TTL/3
// while it is held, so the TTL only bounds how long a crashed holder blocks
// others. Default: DefaultTTL (10 s).
func WithTTL(ttl time.Duration) MutexOption { return func(o *mutexOptions) { o.ttl = ttl } }

// WithHooks installs metrics and logging callbacks. Default: none.
func WithHooks(h Hooks) MutexOption { return func(o *mutexOptions) { o.hooks = h } }

// Mutex wraps a Locker with what callers otherwise write by hand: a default
// TTL, a watchdog that keeps the lease alive while it is held, a loss signal,
// and Do, which runs a function under the lock with a context that is
// cancelled the moment the lease is lost.
type Mutex struct {
	locker Locker
	opts   mutexOptions
}

// NewMutex returns a Mutex over l.
func NewMutex(l Locker, opts ...MutexOption) (*Mutex, error) {
	if l == nil {
		return nil, errors.New("lock: NewMutex: nil Locker")
	}
	o := mutexOptions{ttl: DefaultTTL}
	for _, opt := range opts {
		opt(&o)
	}
	if err := ValidateTTL(o.ttl); err != nil {
		return nil, fmt.Errorf("lock: NewMutex: %w", err)
	}
	return &Mutex{locker: l, opts: o}, nil
}

// Lock waits until key is acquired or ctx ends, then keeps the lease alive
// in the background until Release or loss.
func (m *Mutex) Lock(ctx context.Context, key string) (*Held, error) {
	return m.lock(ctx, key, m.locker.Acquire)
}

// TryLock is Lock without waiting: it fails with ErrNotAcquired when key is
// held.
func (m *Mutex) TryLock(ctx context.Context, key string) (*Held, error) {
	return m.lock(ctx, key, m.locker.TryAcquire)
}

func (m *Mutex) lock(ctx context.Context, key string,
	acquire func(context.Context, string, time.Duration) (Lease, error)) (*Held, error) {
	start := time.Now()
	l, err := acquire(ctx, key, m.opts.ttl)
	if h := m.opts.hooks.OnAcquire; h != nil {
		var fence uint64
		if l != nil {
			fence = l.Fence()
		}
		h(key, fence, time.Since(start), err)
	}
	if err != nil {
		return nil, err
	}
	h := &Held{
		Lease:    l,
		ttl:      m.opts.ttl,
		hooks:    m.opts.hooks,
		acquired: time.Now(),
		stop:     make(chan struct{}),
		exited:   make(chan struct{}),
		lostCh:   make(chan struct{}),
	}
	go h.watchdog()
	return h, nil
}

// Do acquires key, runs fn while the lease is kept alive, and releases it.
// The ctx passed to fn is cancelled, with ErrLockLost as its cause, as soon
// as the lease is lost; fn should stop writing then. Do returns fn's error;
// if the lease was lost while fn ran, the result also matches ErrLockLost,
// even when fn itself succeeded, because its work may have overlapped
// another holder's.
func (m *Mutex) Do(ctx context.Context, key string, fn func(ctx context.Context, l Lease) error) error {
	h, err := m.Lock(ctx, key)
	if err != nil {
		return err
	}
	fctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		select {
		case <-h.lostCh:
			cancel(ErrLockLost)
		case <-fctx.Done():
		}
	}()
	fnErr := fn(fctx, h)
	relErr := h.Release(ctx)
	cancel(nil)
	<-watchDone
	lost := errors.Is(relErr, ErrLockLost) || errors.Is(context.Cause(fctx), ErrLockLost)
	switch {
	case fnErr != nil && lost && !errors.Is(fnErr, ErrLockLost):
		return errors.Join(fnErr, ErrLockLost)
	case fnErr != nil:
		return fnErr
	case lost:
		return fmt.Errorf("lock: %q lost while held: %w", key, ErrLockLost)
	default:
		return relErr
	}
}

// Held is a lease taken through a Mutex. It embeds the driver's Lease, so
// Key, Token, Fence and Done behave as documented there; Release also stops
// the watchdog, and Err tells why Done closed.
type Held struct {
	Lease
	ttl      time.Duration
	hooks    Hooks
	acquired time.Time

	stopOnce sync.Once
	stop     chan struct{}
	exited   chan struct{}
	lostCh   chan struct{} // closed by markLost

	mu       sync.Mutex
	released bool
	lost     error
}

// Release stops the watchdog, waiting until it has stopped, and releases the
// lease. Like Lease.Release it works with a cancelled ctx.
func (h *Held) Release(ctx context.Context) error {
	h.stopOnce.Do(func() { close(h.stop) })
	<-h.exited
	h.mu.Lock()
	h.released = true
	h.mu.Unlock()
	err := h.Lease.Release(ctx)
	if errors.Is(err, ErrLockLost) {
		h.markLost()
	}
	if cb := h.hooks.OnRelease; cb != nil {
		cb(h.Key(), time.Since(h.acquired), err)
	}
	return err
}

// Err returns nil while the lease is held or after a clean Release, and an
// error matching ErrLockLost once the lease is known to be lost.
func (h *Held) Err() error { return h.lostErr() }

// Lost is closed when the lease is lost before Release; unlike Done it stays
// open on a clean Release.
func (h *Held) Lost() <-chan struct{} { return h.lostCh }

func (h *Held) lostErr() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lost
}

func (h *Held) markLost() {
	h.mu.Lock()
	first := h.lost == nil
	if first {
		h.lost = fmt.Errorf("lock: %q: %w", h.Key(), ErrLockLost)
		close(h.lostCh)
	}
	h.mu.Unlock()
	if first && h.hooks.OnLost != nil {
		h.hooks.OnLost(h.Key(), h.Fence())
	}
}

// watchdog refreshes the lease every ttl/3 (±10 % jitter) until Release
// stops it or the lease is lost. After a failed refresh it retries at
// ttl/10; the driver closes Done when the TTL runs out without success.
func (h *Held) watchdog() {
	defer close(h.exited)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-h.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	interval := h.ttl / 3
	timer := time.NewTimer(jitter(interval))
	defer timer.Stop()
	for {
		select {
		case <-h.stop:
			return
		case <-h.Lease.Done():
			h.mu.Lock()
			released := h.released
			h.mu.Unlock()
			if !released {
				h.markLost()
			}
			return
		case <-timer.C:
		}
		rctx, rcancel := context.WithTimeout(ctx, interval)
		err := h.Lease.Refresh(rctx, h.ttl)
		rcancel()
		switch {
		case err == nil:
			timer.Reset(jitter(interval))
		case errors.Is(err, ErrLockLost):
			select {
			case <-h.stop: // Release raced with the refresh; not a loss.
				return
			default:
			}
			h.markLost()
			return
		default:
			select {
			case <-h.stop:
				return
			default:
			}
			if cb := h.hooks.OnRefreshError; cb != nil {
				cb(h.Key(), err)
			}
			timer.Reset(jitter(max(h.ttl/10, time.Millisecond)))
		}
	}
}

// jitter returns d ± 10 %.
func jitter(d time.Duration) time.Duration {
	span := int64(d) / 5
	if span <= 0 {
		return d
	}
	return d - time.Duration(span/2) + time.Duration(rand.Int64N(span))
}
