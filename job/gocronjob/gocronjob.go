package gocronjob

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/oncekit/oncekit/core/lock"
)

// Option configures NewLocker.
type Option func(*options)

type options struct {
	ttl, atLeast time.Duration
	prefix       string
}

// WithTTL sets the lock's TTL: a replica that dies while it runs a job
// holds it that long. The lease is refreshed while the job runs. Default
// 30 s.
func WithTTL(d time.Duration) Option { return func(o *options) { o.ttl = d } }

// WithHoldAtLeast keeps a lock held for at least d after it was taken,
// however short the job: it must exceed the clock splay between the
// replicas' schedulers. Default 1 s.
func WithHoldAtLeast(d time.Duration) Option { return func(o *options) { o.atLeast = d } }

// WithKeyPrefix sets the prefix of the lock keys before the job's name.
// Default "gocron/".
func WithKeyPrefix(p string) Option { return func(o *options) { o.prefix = p } }

// NewLocker returns a gocron.Locker over l.
func NewLocker(l lock.Locker, opts ...Option) (gocron.Locker, error) {
	o := options{ttl: 30 * time.Second, atLeast: time.Second, prefix: "gocron/"}
	for _, opt := range opts {
		opt(&o)
	}
	if l == nil || o.atLeast < 0 {
		return nil, errors.New("gocronjob: NewLocker needs a lock.Locker and a hold that is not negative")
	}
	m, err := lock.NewMutex(l, lock.WithTTL(o.ttl))
	if err != nil {
		return nil, fmt.Errorf("gocronjob: %w", err)
	}
	return &locker{m: m, o: o}, nil
}

type locker struct {
	m *lock.Mutex
	o options
}

// Lock takes the job's lock without waiting; gocron skips the run when it
// fails.
func (l *locker) Lock(ctx context.Context, key string) (gocron.Lock, error) {
	h, err := l.m.TryLock(ctx, l.o.prefix+key)
	if err != nil {
		return nil, err
	}
	return &held{h: h, taken: time.Now(), atLeast: l.o.atLeast}, nil
}

type held struct {
	h       *lock.Held
	taken   time.Time
	atLeast time.Duration
}

// Unlock releases the lock, or, before WithHoldAtLeast has passed since
// it was taken, arranges its release then and returns nil.
func (h *held) Unlock(ctx context.Context) error {
	if rest := h.atLeast - time.Since(h.taken); rest > 0 {
		time.AfterFunc(rest, func() {
			rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = h.h.Release(rctx)
		})
		return nil
	}
	return h.h.Release(ctx)
}
