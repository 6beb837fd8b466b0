package redisstore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/internal/token"
)

var (
	//go:embed lua/acquire.lua
	acquireLua string
	//go:embed lua/release.lua
	releaseLua string
	//go:embed lua/refresh.lua
	refreshLua string

	acquireScript = redis.NewScript(acquireLua)
	releaseScript = redis.NewScript(releaseLua)
	refreshScript = redis.NewScript(refreshLua)
)

// Client is the part of go-redis the Store uses. redis.UniversalClient
// (*redis.Client, *redis.ClusterClient, a Sentinel failover client, *redis.Ring)
// satisfies it.
type Client interface {
	redis.Scripter
	Subscribe(ctx context.Context, channels ...string) *redis.PubSub
	SSubscribe(ctx context.Context, channels ...string) *redis.PubSub
	Info(ctx context.Context, section ...string) *redis.StringCmd
}

// Store is a lock.Locker over one Redis deployment. It is safe for
// concurrent use; Close releases its pub/sub connection.
type Store struct {
	client Client
	opts   options
	sub    *subscriber
}

// New returns a Store over client. It makes no request until first used.
func New(client Client, opts ...Option) (*Store, error) {
	if client == nil {
		return nil, errors.New("redisstore: New: nil client")
	}
	o := defaultOptions()
	for _, opt := range opts {
		opt(&o)
	}
	if err := o.validate(); err != nil {
		return nil, fmt.Errorf("redisstore: New: %w", err)
	}
	s := &Store{client: client, opts: o}
	s.sub = newSubscriber(client, o.pubsub)
	return s, nil
}

// Close stops the Store's pub/sub connection and wakes its waiters, which
// then fail with lock.ErrClosed. Leases taken earlier stay valid and can
// still be refreshed and released. Close does not close the client.
func (s *Store) Close() error { return s.sub.close() }

func (s *Store) lockKey(key string) string  { return s.opts.prefix + "{" + key + "}" }
func (s *Store) fenceKey(key string) string { return s.opts.prefix + "{" + key + "}:fence" }
func (s *Store) channel(key string) string  { return s.opts.prefix + "{" + key + "}:release" }

func (s *Store) modeArg() string {
	switch s.opts.pubsub {
	case PubSubSharded:
		return "s"
	case PubSubClassic:
		return "c"
	case PubSubOff:
		return "n"
	}
	return "a"
}

// TryAcquire implements lock.Locker in one round trip.
func (s *Store) TryAcquire(ctx context.Context, key string, ttl time.Duration) (lock.Lease, error) {
	if err := lock.Validate(key, ttl); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, errors.Join(lock.ErrNotAcquired, err)
	}
	l, held, err := s.attempt(ctx, key, token.New(), ttl)
	if err != nil {
		return nil, err
	}
	if held != nil {
		return nil, held
	}
	return l, nil
}

// Acquire implements lock.Locker. An uncontended call is one round trip.
// When the key is held, the caller subscribes to the key's release channel
// (one shared connection per Store) and tries again when the holder
// releases, when the holder's remaining TTL runs out, or at the latest after
// the recheck interval.
func (s *Store) Acquire(ctx context.Context, key string, ttl time.Duration) (lock.Lease, error) {
	if err := lock.Validate(key, ttl); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, errors.Join(lock.ErrNotAcquired, err)
	}
	tok := token.New()
	l, held, err := s.attempt(ctx, key, tok, ttl)
	if err != nil || held == nil {
		return l, err
	}

	w, err := s.sub.watch(ctx, s.channel(key))
	if err != nil {
		return nil, err
	}
	defer s.sub.unwatch(w)
	backoff := s.opts.minBackoff
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	for {
		// Subscribed first, then tried: a release between the two is seen.
		l, held, err := s.attempt(ctx, key, tok, ttl)
		if err != nil || held == nil {
			return l, err
		}
		wait := s.opts.recheck
		switch {
		case !w.subscribed() || held.TTL < 0:
			wait = min(wait, backoff/2+rand.N(backoff/2+1))
			backoff = min(2*backoff, s.opts.maxBackoff)
		case held.TTL < wait:
			wait = held.TTL + time.Millisecond
		}
		timer.Reset(wait)
		select {
		case <-w.wake:
		case <-timer.C:
		case <-w.closed:
			return nil, fmt.Errorf("redisstore: acquire %q: %w", key, lock.ErrClosed)
		case <-ctx.Done():
			return nil, errors.Join(lock.ErrNotAcquired, ctx.Err())
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

// attempt runs the acquire script once. It returns a lease, or a
// *lock.HeldError, or an error. Nothing is left behind by a failed attempt:
// after an error that may have come after the script ran (a timeout, a
// cancelled ctx, a broken connection) it deletes whatever the attempt may
// have taken, and the script itself refuses to take the key once ctx's
// deadline has passed by the server's clock, for a request that reaches the
// server late (a paused server, a slow network) when the clean-up cannot.
func (s *Store) attempt(ctx context.Context, key, tok string, ttl time.Duration) (*lease, *lock.HeldError, error) {
	start := time.Now()
	var deadline int64
	if d, ok := ctx.Deadline(); ok {
		deadline = d.UnixMilli()
	}
	res, err := acquireScript.Run(ctx, s.client,
		[]string{s.lockKey(key), s.fenceKey(key)}, tok, ttl.Milliseconds(), deadline).Int64Slice()
	if err != nil {
		if !isRedisReply(err) {
			cctx, cancel := lock.CleanupContext(ctx)
			_ = releaseScript.Run(cctx, s.client, []string{s.lockKey(key)}, tok, s.channel(key), s.modeArg()).Err()
			cancel()
		}
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, nil, errors.Join(lock.ErrNotAcquired, ctxErr)
		}
		return nil, nil, fmt.Errorf("redisstore: acquire %q: %w", key, err)
	}
	if len(res) != 2 {
		return nil, nil, fmt.Errorf("redisstore: acquire %q: unexpected script reply %v", key, res)
	}
	if res[0] < 0 {
		return nil, nil, errors.Join(lock.ErrNotAcquired, context.DeadlineExceeded)
	}
	if res[0] == 0 {
		ttl := time.Duration(res[1]) * time.Millisecond
		if res[1] < 0 {
			ttl = -1
		}
		return nil, &lock.HeldError{Key: key, TTL: ttl}, nil
	}
	return newLease(s, key, tok, uint64(res[1]), start, ttl), nil, nil
}

// isRedisReply reports whether err is an error reply from the server: the
// request arrived and failed as a whole, so there is nothing to undo.
func isRedisReply(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
}

type leaseState int

const (
	held leaseState = iota
	released
	lost
)

type lease struct {
	s     *Store
	key   string
	token string
	fence uint64
	done  chan struct{}

	mu       sync.Mutex
	state    leaseState
	deadline time.Time   // start of the last successful acquire/refresh + its TTL
	timer    *time.Timer // fires at deadline
}

func newLease(s *Store, key, tok string, fence uint64, start time.Time, ttl time.Duration) *lease {
	l := &lease{s: s, key: key, token: tok, fence: fence, done: make(chan struct{}), deadline: start.Add(ttl)}
	l.mu.Lock() // the timer may fire before AfterFunc returns
	defer l.mu.Unlock()
	l.timer = time.AfterFunc(time.Until(l.deadline), l.expire)
	return l
}

func (l *lease) Key() string           { return l.key }
func (l *lease) Token() string         { return l.token }
func (l *lease) Fence() uint64         { return l.fence }
func (l *lease) Done() <-chan struct{} { return l.done }

// expire runs at the local deadline: with no successful refresh the lease
// is no longer ours (the deadline counts from before the request was sent,
// so it never passes after the server's own expiry).
func (l *lease) expire() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state != held {
		return
	}
	if d := time.Until(l.deadline); d > 0 {
		l.timer.Reset(d)
		return
	}
	l.endLocked(lost)
}

func (l *lease) endLocked(st leaseState) {
	if l.state != held {
		return
	}
	l.state = st
	l.timer.Stop()
	close(l.done)
}

// Refresh extends the lease in one round trip.
func (l *lease) Refresh(ctx context.Context, ttl time.Duration) error {
	if err := lock.ValidateTTL(ttl); err != nil {
		return err
	}
	l.mu.Lock()
	st := l.state
	l.mu.Unlock()
	if st != held {
		return fmt.Errorf("redisstore: refresh %q: %w", l.key, lock.ErrLockLost)
	}
	start := time.Now()
	ok, err := refreshScript.Run(ctx, l.s.client, []string{l.s.lockKey(l.key)}, l.token, ttl.Milliseconds()).Int64()
	if err != nil {
		return fmt.Errorf("redisstore: refresh %q: %w", l.key, err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if ok == 0 {
		l.endLocked(lost)
		return fmt.Errorf("redisstore: refresh %q: %w", l.key, lock.ErrLockLost)
	}
	if l.state != held {
		// The local deadline passed while the refresh was in flight: the
		// lease was already reported lost, so give the key back.
		cctx, cancel := lock.CleanupContext(ctx)
		defer cancel()
		_ = releaseScript.Run(cctx, l.s.client, []string{l.s.lockKey(l.key)}, l.token, l.s.channel(l.key), l.s.modeArg()).Err()
		return fmt.Errorf("redisstore: refresh %q: %w", l.key, lock.ErrLockLost)
	}
	l.deadline = start.Add(ttl)
	l.timer.Reset(time.Until(l.deadline))
	return nil
}

// Release deletes the lease and publishes the release message in one round
// trip. With a cancelled ctx it still runs, under lock.ReleaseTimeout.
func (l *lease) Release(ctx context.Context) error {
	l.mu.Lock()
	st := l.state
	l.mu.Unlock()
	if st == released {
		return nil
	}
	if ctx.Err() != nil {
		var cancel context.CancelFunc
		ctx, cancel = lock.CleanupContext(ctx)
		defer cancel()
	}
	ok, err := releaseScript.Run(ctx, l.s.client, []string{l.s.lockKey(l.key)}, l.token, l.s.channel(l.key), l.s.modeArg()).Int64()
	if err != nil {
		return fmt.Errorf("redisstore: release %q: %w", l.key, err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if ok == 0 {
		l.endLocked(lost)
		if l.state == released { // a concurrent Release won
			return nil
		}
		return fmt.Errorf("redisstore: release %q: %w", l.key, lock.ErrLockLost)
	}
	l.endLocked(released)
	if l.state == lost {
		// Our local deadline had passed but the key was still ours; it is
		// deleted now, which is what the caller asked for.
		l.state = released
	}
	return nil
}

var (
	_ lock.Locker = (*Store)(nil)
	_ lock.Lease  = (*lease)(nil)
)
