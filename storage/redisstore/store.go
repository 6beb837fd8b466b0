package redisstore

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/lock/lockdriver"
	"github.com/oncekit/oncekit/core/observe"
	"github.com/oncekit/oncekit/storage/internal/keep"
	"github.com/oncekit/oncekit/storage/internal/rediskit"
	"github.com/oncekit/oncekit/storage/internal/redisnotify"
)

// Client is the part of go-redis the Store uses: redis.Scripter, Subscribe,
// SSubscribe and Info. *redis.Client, a Sentinel failover client and
// *redis.ClusterClient are supported. *redis.Ring is refused by New: it
// shards keys by client-side hashing that ignores hash tags, so one
// lock's keys, its multi-key scripts and its pub/sub would not meet on one
// server.
type Client interface {
	redis.Scripter
	Subscribe(ctx context.Context, channels ...string) *redis.PubSub
	SSubscribe(ctx context.Context, channels ...string) *redis.PubSub
	Info(ctx context.Context, section ...string) *redis.StringCmd
	Time(ctx context.Context) *redis.TimeCmd
}

// Store is a lock.Locker, an idemdriver.Store (Begin, Complete, Abandon,
// Extend, each one round trip), an idemdriver.EffectStore and an inspector
// (lockdriver.Inspector, idemdriver.Inspector) over one Redis deployment. It is safe
// for concurrent use; Close releases its pub/sub connection.
//
// Goroutines of one Store that wait for the same key queue up locally, first
// come first served, and only the first of them competes in Redis. When a
// lease of the Store is released while others of the same Store wait, the
// key is handed straight to the next one in a single round trip (a new
// token and a new fence, without letting go of the key), up to
// WithMaxLocalHandOffs times in a row before the key is let go so that
// other processes get their turn.
type Store struct {
	closed      atomic.Bool  // Close was called: new calls fail with lock.ErrClosed
	owned       func() error // closes the client storage.Open made (nil for New's)
	ownOnce     sync.Once
	base        rediskit.Base     // what both Redis drivers share (options, names, script calls)
	fin         rediskit.Finisher // idemdriver.Store's Complete, Abandon and Extend
	client      Client            // scripts go through it: auto-pipelined when the client can pipeline
	raw         Client            // the client as given
	handOffs    keep.HandOffs
	linger      time.Duration
	sub         *redisnotify.Subscriber
	unfenced    bool             // WithoutFencing
	stockPrefix string           // WithStockPrefix
	setNX       rediskit.SetNXer // the client, for unfenced takes of a free key; nil when it has no SetNX
	get         rediskit.Getter  // the client, for a replay's plain GET (see Begin); nil when it has no Get
	replays     atomic.Int32     // how many recent Begins found a completed record, net, within ±8 (seen)

	mu      sync.Mutex
	keys    map[string]*local
	closing bool        // Close has begun: no hold is kept any more
	recent  keep.Recent // when this Store last let each key go in Redis (markHotLocked)

	// abandoned holds the tokens of waiters that left without the key while
	// a release could still grant it to them (a while after they left);
	// only those are given back when a grant arrives for nobody (a token
	// that won the key by its own attempt must not be).
	abandoned sync.Map // token -> struct{}
}

// local is what one Store knows of a key: its own lease on it and its own
// waiters for it.
type local struct {
	holder      *lease    // this Store's live lease on the key, or nil
	kept        *kept     // this Store's hold on the key, kept after a Release, or nil
	hot         bool      // the Store took the key again right after letting it go
	handingOff  bool      // a hand-off to a queued waiter is in flight
	competitors int       // waiters trying Redis
	queue       list.List // *waiter, first come first served
	handOffs    int       // hand-offs since the key was last let go
}

// waiter is a blocked Acquire.
type waiter struct {
	ttl   time.Duration
	owner string
	token string
	ev    chan event    // buffered(1): at most one event is outstanding
	elem  *list.Element // non-nil while queued
	seen  uint64        // the highest fence floor its busy attempts saw (see granted)
}

// event tells a queued waiter that it got the key (lease) or that it is its
// turn to compete for it in Redis.
type event struct {
	lease *lease
	freed time.Time // when the hand-off began
}

// New returns a Store over client. It makes no request until first used.
func New(client Client, opts ...Option) (*Store, error) {
	if client == nil {
		return nil, errors.New("redisstore: New: nil client")
	}
	if _, ring := client.(*redis.Ring); ring {
		return nil, errors.New("redisstore: New: *redis.Ring is not supported: it shards by client-side hashing that " +
			"ignores hash tags, so a lock's keys and its release channel would not meet on one server; " +
			"use a *redis.Client, a Sentinel failover client or a *redis.ClusterClient")
	}
	o := defaultOptions()
	for _, opt := range opts {
		opt(&o)
	}
	if err := o.validate(); err != nil {
		return nil, fmt.Errorf("redisstore: New: %w", err)
	}
	scripts := client
	if p, ok := client.(rediskit.Pipeliner); ok {
		scripts = rediskit.AutoPipeline(p)
	}
	s := &Store{
		client:      scripts,
		raw:         client,
		handOffs:    keep.HandOffs{Max: o.maxHandOffs, Hold: o.maxHold},
		linger:      o.linger,
		unfenced:    o.unfenced,
		stockPrefix: o.StockPrefix,
		sub:         redisnotify.New(client, o.PubSub),
		keys:        make(map[string]*local),
	}
	if sn, ok := client.(rediskit.SetNXer); ok && o.unfenced && o.replication.Replicas == 0 {
		s.setNX = sn
	}
	if g, ok := client.(rediskit.Getter); ok && o.replication.Replicas == 0 {
		// (With replicas a replay writes, for WAIT to cover the
		// completion it read: the script's.)
		s.get = g
	}
	s.base.Init(o.Options)
	s.base.Replication = o.replication
	// One deployment: its release alone decides who holds a key, and may
	// hand it to the next process. Not with replica acknowledgement: a
	// release does not wait for the replicas, so a key it granted could
	// be lost in a failover; the woken process takes it with a write that
	// waits.
	s.base.Grants = o.replication.Replicas == 0
	s.sub.OnOrphanGrant(func(channel, payload string) {
		if tok, _, _, ok := rediskit.ParseGrant(payload); !ok || !s.isAbandoned(tok) {
			return
		}
		s.base.BG.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), lockdriver.ReleaseTimeout)
			defer cancel()
			s.base.ReleaseOrphanGrant(ctx, s.client, channel, payload)
		})
	})
	s.fin.FinishClaim = s.finish
	return s, nil
}

// Close lets go of the keys the Store kept after their Release (see
// WithLinger), stops the Store's pub/sub connection and wakes its waiters,
// which then fail with lock.ErrClosed, and waits for requests that callers
// stopped waiting for (a cancelled Acquire) to finish their clean-up.
// Leases taken earlier stay valid and can still be refreshed and released.
// Close does not close a client given to New; a Store storage.Open made
// closes the client it opened.
func (s *Store) Close() error {
	s.closed.Store(true)
	s.releaseKept()
	err := s.sub.Close()
	s.base.BG.Wait()
	if s.owned != nil {
		s.ownOnce.Do(func() { err = errors.Join(err, s.owned()) })
	}
	return err
}

// Client returns the client the Store was made with (for a Store that
// storage.Open made, the redis.UniversalClient it opened: an application
// keeps its own data through it beside the driver's).
func (s *Store) Client() Client { return s.raw }

// Warm opens n connections of the client's pool (of each primary's on a
// Cluster) ahead of traffic and hands them back idle, so that the first
// burst of requests after a quiet start does not dial on its critical
// path; n ≤ 0 opens as many as the pool holds (go-redis' PoolSize). A
// service calls it once, before it reports ready (storage.Warmer); go-redis
// closes a connection left idle longer than ConnMaxIdleTime (30 minutes by
// default). A client that is not go-redis' *redis.Client or
// *redis.ClusterClient is left as it is.
func (s *Store) Warm(ctx context.Context, n int) error {
	if s.closed.Load() {
		return fmt.Errorf("redisstore: warm: %w", lock.ErrClosed)
	}
	if err := rediskit.Warm(ctx, s.raw, n); err != nil {
		return fmt.Errorf("redisstore: warm: %w", err)
	}
	return nil
}

const driverName = "redis"

// closedErr reports a call op on key after Close, nil before.
func (s *Store) closedErr(op, key string) error {
	if !s.closed.Load() {
		return nil
	}
	return fmt.Errorf("redisstore: %s %q: %w", op, key, lock.ErrClosed)
}

// DriverName implements observe.Source: "redis".
func (s *Store) DriverName() string { return driverName }

// Observer implements observe.Source: the WithObserver option.
func (s *Store) Observer() observe.Observer { return s.base.Options.Observer }

// watch subscribes to a channel, with the subscriber's errors as lock
// errors.
func (s *Store) watch(ctx context.Context, channel string) (*redisnotify.Watcher, error) {
	w, err := s.sub.Watch(ctx, channel)
	switch {
	case errors.Is(err, redisnotify.ErrClosed):
		return nil, fmt.Errorf("redisstore: %w", lock.ErrClosed)
	case err != nil:
		return nil, errors.Join(lock.ErrNotAcquired, err)
	}
	return w, nil
}

var (
	_ lock.Locker          = (*Store)(nil)
	_ idemdriver.Store     = (*Store)(nil)
	_ idemdriver.Waiter    = (*Store)(nil)
	_ lockdriver.Inspector = (*Store)(nil)
	_ idemdriver.Inspector = (*Store)(nil)
)

// Ping is a health check for readiness probes: one request (TIME) to the
// server, or, under Cluster, to one of its nodes.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.raw.Time(ctx).Err(); err != nil {
		return fmt.Errorf("redisstore: ping: %w", err)
	}
	return nil
}
