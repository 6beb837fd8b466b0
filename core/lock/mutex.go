package lock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oncekit/oncekit/core/observe"
)

// DefaultTTL is the lease TTL a Mutex uses unless WithTTL says otherwise.
const DefaultTTL = 10 * time.Second

// MutexOption configures a Mutex.
type MutexOption func(*mutexOptions)

type mutexOptions struct {
	ttl      time.Duration
	wait     time.Duration // 0: as long as ctx allows
	observer observe.Observer
	observed bool // WithObserver was given, even if nil
}

// WithTTL sets the TTL of each lease. The watchdog refreshes it every TTL/3
// while it is held, so the TTL only bounds how long a crashed holder blocks
// others. Default: DefaultTTL (10 s).
func WithTTL(ttl time.Duration) MutexOption { return func(o *mutexOptions) { o.ttl = ttl } }

// WithWaitTimeout bounds how long Lock and Do wait for the key, apart from
// ctx: Do(ctx, ...) then waits at most d while ctx, with its own deadline,
// stays the parent of the work. A wait that times out fails with an error
// matching ErrNotAcquired and context.DeadlineExceeded. Default 0: wait as
// long as ctx allows.
func WithWaitTimeout(d time.Duration) MutexOption { return func(o *mutexOptions) { o.wait = d } }

// WithObserver sets where the Mutex reports acquisitions, refreshes,
// releases and lost leases (see package observe). Default: the Locker's own
// Observer when it is an observe.Source (every oncekit driver is), else
// none. WithObserver(nil) turns reporting off.
func WithObserver(o observe.Observer) MutexOption {
	return func(m *mutexOptions) { m.observer, m.observed = o, true }
}

// Mutex wraps a Locker with what callers otherwise write by hand: a default
// TTL, a watchdog that keeps the lease alive while it is held, a loss signal,
// and Do, which runs a function under the lock with a context that is
// cancelled the moment the lease is lost.
type Mutex struct {
	locker Locker
	opts   mutexOptions
	driver string
	held   atomic.Int64
}

// Held returns how many leases taken through this Mutex are not released
// yet (promobs.Observer.WatchMutex exports it as a gauge). A lease that was lost
// counts until its Release.
func (m *Mutex) Held() int64 { return m.held.Load() }

// NewMutex returns a Mutex over l.
func NewMutex(l Locker, opts ...MutexOption) (*Mutex, error) {
	if l == nil {
		return nil, errors.New("lock: NewMutex: nil Locker")
	}
	o := mutexOptions{ttl: DefaultTTL}
	for _, opt := range opts {
		opt(&o)
	}
	if err := checkTTL(o.ttl); err != nil {
		return nil, fmt.Errorf("lock: NewMutex: %w", err)
	}
	if o.wait < 0 {
		return nil, fmt.Errorf("lock: NewMutex: negative wait timeout %s", o.wait)
	}
	if !o.observed {
		o.observer = observe.ObserverOf(l)
	}
	return &Mutex{locker: l, opts: o, driver: observe.DriverOf(l)}, nil
}

// Lock waits until key is acquired or ctx ends, then keeps the lease alive
// in the background until Release or loss.
func (m *Mutex) Lock(ctx context.Context, key string) (Held, error) {
	return m.lock(ctx, key, m.locker.Acquire)
}

// TryLock is Lock without waiting: it fails with ErrNotAcquired when key is
// held.
func (m *Mutex) TryLock(ctx context.Context, key string) (Held, error) {
	return m.lock(ctx, key, m.locker.TryAcquire)
}

func (m *Mutex) lock(ctx context.Context, key string,
	acquire func(context.Context, string, time.Duration) (Lease, error)) (Held, error) {
	octx, call := observe.Begin(ctx, m.opts.observer, observe.LockAcquire, m.driver, key)
	if m.opts.wait > 0 {
		var cancel context.CancelFunc
		octx, cancel = context.WithTimeout(octx, m.opts.wait)
		defer cancel()
	}
	l, err := acquireLive(octx, key, m.opts.ttl, acquire)
	if err != nil {
		call.End(acquireOutcome(err), 0, err)
		return nil, err
	}
	call.End(observe.Acquired, l.Fence(), nil)
	m.held.Add(1)
	h := &held{
		count:    &m.held,
		lease:    l,
		ttl:      m.opts.ttl,
		observer: m.opts.observer,
		driver:   m.driver,
		acquired: time.Now(),
		stop:     make(chan struct{}),
		exited:   make(chan struct{}),
		lostCh:   make(chan struct{}),
	}
	go h.watchdog()
	return h, nil
}

// acquireLive acquires key and returns the lease only while it is live: a
// lease that has already ended when the driver returns it (its TTL ran out
// during a long wait, a loss noticed at once) is given back and the key
// asked for again, until ctx ends. A driver should never return one (the
// conformance suite checks it); the Mutex, and so Do, makes sure.
func acquireLive(ctx context.Context, key string, ttl time.Duration,
	acquire func(context.Context, string, time.Duration) (Lease, error)) (Lease, error) {
	for attempt := 1; ; attempt++ {
		l, err := acquire(ctx, key, ttl)
		if err != nil {
			return nil, err
		}
		select {
		case <-l.Done():
		default:
			return l, nil
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		_ = l.Release(rctx)
		cancel()
		if err := ctx.Err(); err != nil {
			return nil, errors.Join(ErrNotAcquired, err)
		}
		if attempt == 8 {
			return nil, fmt.Errorf("lock: acquire %q: %w: the driver returned %d leases that had already ended", key, ErrNotAcquired, attempt)
		}
	}
}

// Do acquires key, runs fn while the lease is kept alive, and releases it.
// The ctx passed to fn is cancelled, with ErrLockLost as its cause, as soon
// as the lease is lost; fn should stop writing then, and can tell loss from
// its caller's cancellation with context.Cause(ctx) == ErrLockLost (see
// the example). Do returns fn's error, joined with Release's when the
// release failed too (the key may then stay held until its TTL ends);
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
		case <-h.Lost():
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
	case fnErr != nil && relErr != nil && !lost:
		// The key may stay held until its TTL ends: the caller should know.
		return errors.Join(fnErr, relErr)
	case fnErr != nil:
		return fnErr
	case lost:
		return fmt.Errorf("lock: %q lost while held: %w", key, ErrLockLost)
	default:
		return relErr
	}
}

// Held is a lease taken through a Mutex: Key, Token, Fence, Refresh, Done
// and Deadline are the driver's lease's, as documented on Lease (Refresh
// extends it now, besides the watchdog's own refreshes); Release also
// stops the watchdog, waiting until it has stopped, and works with a
// cancelled ctx. The driver's lease itself is not reachable: a Release
// that bypassed the watchdog would be reported as a loss.
type Held interface {
	Lease
	// Err returns nil while the lease is held or after a clean Release,
	// and an error matching ErrLockLost once the lease is known to be
	// lost.
	Err() error
	// Lost is closed when the lease is lost before Release; unlike Done it
	// stays open on a clean Release.
	Lost() <-chan struct{}
}

// held implements Held.
type held struct {
	lease    Lease
	count    *atomic.Int64 // the Mutex's leases held
	ttl      time.Duration
	observer observe.Observer
	driver   string
	acquired time.Time

	stopOnce sync.Once
	stop     chan struct{}
	exited   chan struct{}
	lostCh   chan struct{} // closed by markLost

	mu       sync.Mutex
	released bool
	lost     error
}

func (h *held) Key() string { return h.lease.Key() }

func (h *held) Token() string { return h.lease.Token() }

func (h *held) Fence() uint64 { return h.lease.Fence() }

func (h *held) Refresh(ctx context.Context, ttl time.Duration) error {
	return h.lease.Refresh(ctx, ttl)
}

func (h *held) Done() <-chan struct{} { return h.lease.Done() }

func (h *held) Deadline() time.Time { return h.lease.Deadline() }

func (h *held) Release(ctx context.Context) error {
	h.stopOnce.Do(func() { close(h.stop) })
	<-h.exited
	h.mu.Lock()
	first := !h.released
	h.released = true
	h.mu.Unlock()
	var call observe.Call
	if first { // a repeated Release is not reported again
		h.count.Add(-1)
		ctx, call = observe.Begin(ctx, h.observer, observe.LockRelease, h.driver, h.Key())
	}
	err := h.lease.Release(ctx)
	if errors.Is(err, ErrLockLost) {
		h.markLost()
	}
	outcome := observe.Released
	switch {
	case errors.Is(err, ErrLockLost):
		outcome = observe.Lost
	case err != nil:
		outcome = observe.Error
	}
	call.EndHeld(outcome, h.Fence(), time.Since(h.acquired), err)
	return err
}

func (h *held) Err() error { return h.lostErr() }

func (h *held) Lost() <-chan struct{} { return h.lostCh }

func (h *held) lostErr() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lost
}

func (h *held) markLost() {
	h.mu.Lock()
	first := h.lost == nil
	if first {
		h.lost = fmt.Errorf("lock: %q: %w", h.Key(), ErrLockLost)
		close(h.lostCh)
	}
	h.mu.Unlock()
	if first {
		observe.Record(context.Background(), h.observer, observe.Event{
			Op: observe.LockLost, Driver: h.driver, Key: h.Key(), Outcome: observe.Lost,
			Fence: h.Fence(), Held: time.Since(h.acquired), Err: ErrLockLost,
		})
	}
}

// watchdog refreshes the lease every ttl/3 (±10 % jitter) until Release
// stops it or the lease is lost. After a failed refresh it retries at
// ttl/10; the driver closes Done when the TTL runs out without success.
func (h *held) watchdog() {
	defer close(h.exited)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		// Loss is signalled the moment the lease's Done closes, also while
		// a refresh is in flight (it is then abandoned): a Refresh stuck on
		// an unreachable store must not delay Lost by up to TTL/3.
		select {
		case <-h.stop:
		case <-h.lease.Done():
			h.mu.Lock()
			released := h.released
			h.mu.Unlock()
			if !released {
				h.markLost()
			}
		case <-ctx.Done():
		}
		cancel()
	}()
	interval := h.ttl / 3
	timer := time.NewTimer(jitter(interval))
	defer timer.Stop()
	for {
		select {
		case <-h.stop:
			return
		case <-h.lease.Done():
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
		rctx, call := observe.Begin(rctx, h.observer, observe.LockRefresh, h.driver, h.Key())
		err := h.lease.Refresh(rctx, h.ttl)
		rcancel()
		call.End(leaseOutcome(err), h.Fence(), err)
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
			timer.Reset(jitter(max(h.ttl/10, time.Millisecond)))
		}
	}
}

// acquireOutcome classifies a failed acquisition for the observer.
func acquireOutcome(err error) observe.Outcome {
	switch {
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return observe.Canceled
	case errors.Is(err, ErrNotAcquired):
		return observe.Busy
	case errors.Is(err, ErrInvalidKey) || errors.Is(err, ErrInvalidTTL) || errors.Is(err, ErrInvalidOwner):
		return observe.Invalid
	}
	return observe.Error
}

// leaseOutcome classifies a refresh.
func leaseOutcome(err error) observe.Outcome {
	switch {
	case err == nil:
		return observe.OK
	case errors.Is(err, ErrLockLost):
		return observe.Lost
	}
	return observe.Error
}

// jitter returns d ± 10 %.
func jitter(d time.Duration) time.Duration {
	span := int64(d) / 5
	if span <= 0 {
		return d
	}
	return d - time.Duration(span/2) + time.Duration(rand.Int64N(span))
}

var _ Held = (*held)(nil)
