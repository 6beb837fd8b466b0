package gocronjob

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/lock/lockdriver"
)

// Option configures NewLocker.
type Option func(*options)

type options struct {
	ttl, atLeast time.Duration
	prefix       string
	now          func() time.Time
}

// WithTTL sets the lock's TTL: a replica that dies while it runs a job
// holds it that long. The lease is refreshed every third of it while the
// job runs. Default 30 s.
func WithTTL(d time.Duration) Option { return func(o *options) { o.ttl = d } }

// WithHoldAtLeast sets how long a run holds its job's lock, however short
// the run, until this replica has seen two of the job's ticks and so knows
// its period (after that the hold is the period less a quarter of it, at
// most a second less; see the package documentation). It must exceed the
// splay of the replicas' first ticks and stay below the job's period less
// the store's round trip. Default 900 ms.
func WithHoldAtLeast(d time.Duration) Option { return func(o *options) { o.atLeast = d } }

// WithKeyPrefix sets the prefix of the lock keys before the job's name.
// Default "gocron/".
func WithKeyPrefix(p string) Option { return func(o *options) { o.prefix = p } }

// NewLocker returns a gocron.Locker over l.
func NewLocker(l lock.Locker, opts ...Option) (gocron.Locker, error) {
	o := options{ttl: 30 * time.Second, atLeast: 900 * time.Millisecond, prefix: "gocron/", now: time.Now}
	for _, opt := range opts {
		opt(&o)
	}
	switch {
	case l == nil || o.atLeast < 0:
		return nil, errors.New("gocronjob: NewLocker needs a lock.Locker and a hold that is not negative")
	case o.ttl < lock.MinTTL:
		return nil, errors.New("gocronjob: WithTTL below lock.MinTTL")
	}
	return &locker{l: l, o: o, jobs: map[string]*period{}}, nil
}

type locker struct {
	l    lock.Locker
	o    options
	mu   sync.Mutex
	jobs map[string]*period // by job name: what this replica saw of its ticks
}

// period is what a replica learned of one job's ticks: gocron calls Lock
// at every tick, run or not, so the shortest time between two calls is
// the job's period (a cron schedule's shortest gap).
type period struct {
	last     time.Time
	shortest time.Duration // 0 until two ticks were seen
}

// hold is how long a run of the job, whose tick came at now, holds the
// job's lock at least: the period less a quarter (at most a second), so
// that a replica whose tick comes later in the same period — its clock
// behind, or a DurationJob started later — finds it held, and the next
// tick, a period on, finds it free; before the period is known, the
// WithHoldAtLeast hold.
func (l *locker) hold(name string, now time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	p := l.jobs[name]
	if p == nil {
		p = &period{}
		l.jobs[name] = p
	}
	// A gap shorter than the first hold is no period the Locker supports
	// (a RunNow, a scheduler restarted): it would shrink every later hold.
	if !p.last.IsZero() {
		if gap := now.Sub(p.last); gap > l.o.atLeast && (p.shortest == 0 || gap < p.shortest) {
			p.shortest = gap
		}
	}
	p.last = now
	if p.shortest == 0 {
		return l.o.atLeast
	}
	return p.shortest - min(p.shortest/4, time.Second)
}

// Lock takes the job's lock without waiting; gocron skips the run when it
// fails. The lease is refreshed while the job runs.
func (l *locker) Lock(ctx context.Context, key string) (gocron.Lock, error) {
	now := l.o.now()
	hold := l.hold(key, now)
	lease, err := l.l.TryAcquire(ctx, l.o.prefix+key, l.o.ttl)
	if err != nil {
		return nil, err
	}
	h := &held{lease: lease, until: now.Add(hold), now: l.o.now, stop: make(chan struct{}), stopped: make(chan struct{})}
	go h.keepAlive(l.o.ttl)
	return h, nil
}

type held struct {
	lease         lock.Lease
	until         time.Time
	now           func() time.Time
	stop, stopped chan struct{}
	once          sync.Once
}

// keepAlive refreshes the lease every third of ttl until Unlock, or until
// the lease is lost.
func (h *held) keepAlive(ttl time.Duration) {
	defer close(h.stopped)
	t := time.NewTicker(ttl / 3)
	defer t.Stop()
	for {
		select {
		case <-h.stop:
			return
		case <-h.lease.Done():
			return
		case <-t.C:
			ctx, cancel := lockdriver.CleanupContext(context.Background())
			err := h.lease.Refresh(ctx, ttl)
			cancel()
			if errors.Is(err, lock.ErrLockLost) {
				return
			}
		}
	}
}

// Unlock ends the run's hold on the job's lock: before its hold has passed
// since the tick, it shortens the lease to end then — the store lets the
// key go at that moment, with no request from this replica at the
// boundary, where a late release would make the next tick find the key
// still held — else it releases it.
func (h *held) Unlock(ctx context.Context) error {
	h.once.Do(func() { close(h.stop) })
	<-h.stopped
	if rest := h.until.Sub(h.now()); rest >= lock.MinTTL {
		if err := h.lease.Refresh(ctx, rest); !errors.Is(err, lock.ErrLockLost) {
			return err
		}
		return nil
	}
	if err := h.lease.Release(ctx); err != nil && !errors.Is(err, lock.ErrLockLost) {
		return err
	}
	return nil
}
