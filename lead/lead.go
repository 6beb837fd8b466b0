package lead

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/oncekit/oncekit/core/lock"
)

// Option configures Run and NewElector.
type Option func(*options)

type options struct {
	ttl     time.Duration
	retry   time.Duration
	onError func(error)
}

// WithTTL sets the leader's lease: a dead leader's successor takes over
// within it (the lease is refreshed every third of it while the leader
// lives). Default 10 s.
func WithTTL(d time.Duration) Option { return func(o *options) { o.ttl = d } }

// WithRetryDelay sets the pause, with jitter of up to half of it, before a
// replica competes again after its loop returned or failed, or the store
// failed. Default 1 s.
func WithRetryDelay(d time.Duration) Option { return func(o *options) { o.retry = d } }

// WithOnError is called with each error of the loop or the store. Default:
// none.
func WithOnError(fn func(error)) Option { return func(o *options) { o.onError = fn } }

func build(l lock.Locker, key string, opts []Option) (options, *lock.Mutex, error) {
	o := options{ttl: 10 * time.Second, retry: time.Second, onError: func(error) {}}
	for _, opt := range opts {
		opt(&o)
	}
	switch {
	case l == nil:
		return o, nil, errors.New("lead: no lock.Locker")
	case key == "":
		return o, nil, errors.New("lead: the key is empty")
	case o.retry <= 0 || o.onError == nil:
		return o, nil, errors.New("lead: the retry delay is not positive, or the error hook is nil")
	}
	m, err := lock.NewMutex(l, lock.WithTTL(o.ttl))
	if err != nil {
		return o, nil, fmt.Errorf("lead: %w", err)
	}
	return o, m, nil
}

// Run competes for key until ctx ends, running fn whenever this replica
// leads; it returns ctx's error then. fn's context ends when leadership is
// lost or ctx ends; fn should return then. A panic in fn is turned into an
// error (passed to WithOnError) and the replica competes again.
func Run(ctx context.Context, l lock.Locker, key string, fn func(ctx context.Context, lease lock.Lease) error, opts ...Option) error {
	if fn == nil {
		return errors.New("lead: no function to run")
	}
	o, m, err := build(l, key, opts)
	if err != nil {
		return err
	}
	for {
		err := m.Do(ctx, key, func(ctx context.Context, lease lock.Lease) error { return call(ctx, key, lease, fn) })
		// The loop's own error is reported even when ctx ended meanwhile;
		// only the error that is ctx ending is not.
		if err != nil && (ctx.Err() == nil || !errors.Is(err, ctx.Err())) {
			o.onError(err)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		t := time.NewTimer(o.retry/2 + rand.N(o.retry/2+1))
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

func call(ctx context.Context, key string, lease lock.Lease, fn func(context.Context, lock.Lease) error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("lead: %q: the loop panicked: %v", key, p)
		}
	}()
	return fn(ctx, lease)
}

// ErrNotLeader is IsLeader's answer on a replica that does not lead.
var ErrNotLeader = errors.New("lead: this replica does not lead")

// Elector campaigns for a key in the background and says whether this
// replica leads.
type Elector struct {
	// lease is the leader's lease while this replica leads, nil otherwise.
	// Leading is having it, never a fence that is not 0: a store that
	// issues no fences (WithoutFencing) leads with fence 0.
	lease atomic.Pointer[lock.Lease]
	done  chan struct{}
}

// NewElector starts campaigning for key until ctx ends (see Run); the
// Elector then stops leading. Errors are reported to WithOnError.
func NewElector(ctx context.Context, l lock.Locker, key string, opts ...Option) (*Elector, error) {
	if _, _, err := build(l, key, opts); err != nil {
		return nil, err
	}
	e := &Elector{done: make(chan struct{})}
	go func() {
		defer close(e.done)
		_ = Run(ctx, l, key, func(ctx context.Context, lease lock.Lease) error {
			e.lease.Store(&lease)
			defer e.lease.Store(nil)
			<-ctx.Done()
			return nil
		}, opts...)
	}()
	return e, nil
}

// IsLeader returns nil while this replica leads, ErrNotLeader otherwise
// (go-co-op/gocron v2's Elector interface). Leadership can end right after
// it answered: pass Fence to what the leader writes.
func (e *Elector) IsLeader(context.Context) error {
	if e.lease.Load() == nil {
		return ErrNotLeader
	}
	return nil
}

// Fence is the fence of the leader's lease while this replica leads, 0
// otherwise — and 0 while it leads on a store that issues no fences
// (redisstore's and redlockstore's WithoutFencing): ask IsLeader whether
// it leads.
func (e *Elector) Fence() uint64 {
	if l := e.lease.Load(); l != nil {
		return (*l).Fence()
	}
	return 0
}

// Done is closed once the Elector stopped campaigning (its ctx ended).
func (e *Elector) Done() <-chan struct{} { return e.done }
