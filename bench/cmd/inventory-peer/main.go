// Command inventory-peer is the inventory service with its per-SKU lock
// taken through a peer library instead of oncekit's, for the flash-sale
// benchmark (BenchmarkFlashSalePeers): INVENTORY_PEER_LOCK=redislock or
// redsync, on the store's Redis server. The peers' leases carry no fence,
// so its sales are unfenced; everything else is the inventory command.
package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"sync"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/examples/inventory/app"
)

func main() {
	os.Exit(app.Main(os.Args[1:], os.Stdout, os.Stderr, app.Options{SKULocker: peerLocker}))
}

// peerLocker opens the peer named by INVENTORY_PEER_LOCK on the first
// Redis server of the store URL (redis://host:port).
func peerLocker(storeURL string) (lock.Locker, func(), error) {
	u, err := url.Parse(storeURL)
	if err != nil || u.Scheme != "redis" {
		return nil, nil, fmt.Errorf("inventory-peer: the store must be redis://host:port, not %q", storeURL)
	}
	c := redis.NewClient(&redis.Options{Addr: u.Host, ContextTimeoutEnabled: true}) // as oncekit's replicas
	switch peer := os.Getenv("INVENTORY_PEER_LOCK"); peer {
	case "redislock":
		rl := redislock.New(c)
		opts := &redislock.Options{RetryStrategy: redislock.LinearBackoff(10 * time.Millisecond)}
		return locker(func(ctx context.Context, key string, ttl time.Duration) (*peerLease, error) {
			l, err := rl.Obtain(ctx, key, ttl, opts)
			if err != nil {
				return nil, err
			}
			return newLease(key, l.Token(), ttl,
				func(ctx context.Context, ttl time.Duration) error { return l.Refresh(ctx, ttl, nil) },
				func(ctx context.Context) error { return l.Release(ctx) }), nil
		}), func() { c.Close() }, nil
	case "redsync":
		rs := redsync.New(goredis.NewPool(c))
		return locker(func(ctx context.Context, key string, ttl time.Duration) (*peerLease, error) {
			m := rs.NewMutex(key, redsync.WithExpiry(ttl), redsync.WithTries(1<<20), redsync.WithRetryDelay(10*time.Millisecond))
			if err := m.LockContext(ctx); err != nil {
				return nil, err
			}
			return newLease(key, m.Value(), ttl,
				func(ctx context.Context, _ time.Duration) error { _, err := m.ExtendContext(ctx); return err },
				func(ctx context.Context) error {
					ok, err := m.UnlockContext(ctx)
					if err == nil && !ok {
						err = lock.ErrLockLost
					}
					return err
				}), nil
		}), func() { c.Close() }, nil
	}
	c.Close()
	return nil, nil, errors.New("inventory-peer: set INVENTORY_PEER_LOCK to redislock or redsync")
}

// locker adapts a peer's obtain call to lock.Locker.
type locker func(ctx context.Context, key string, ttl time.Duration) (*peerLease, error)

func (l locker) Acquire(ctx context.Context, key string, ttl time.Duration) (lock.Lease, error) {
	return l(ctx, key, ttl)
}

func (l locker) TryAcquire(ctx context.Context, key string, ttl time.Duration) (lock.Lease, error) {
	return l(ctx, key, ttl)
}

// peerLease is a peer's lock as a lock.Lease, with no fence.
type peerLease struct {
	key, token string
	refresh    func(context.Context, time.Duration) error
	release    func(context.Context) error
	mu         sync.Mutex
	deadline   time.Time
	done       chan struct{}
	once       sync.Once
}

func newLease(key, token string, ttl time.Duration, refresh func(context.Context, time.Duration) error, release func(context.Context) error) *peerLease {
	return &peerLease{key: key, token: token, refresh: refresh, release: release, deadline: time.Now().Add(ttl), done: make(chan struct{})}
}

func (p *peerLease) Key() string           { return p.key }
func (p *peerLease) Token() string         { return p.token }
func (p *peerLease) Fence() uint64         { return 0 }
func (p *peerLease) Done() <-chan struct{} { return p.done }

func (p *peerLease) Deadline() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.deadline
}

func (p *peerLease) Refresh(ctx context.Context, ttl time.Duration) error {
	start := time.Now()
	if err := p.refresh(ctx, ttl); err != nil {
		return err
	}
	p.mu.Lock()
	p.deadline = start.Add(ttl)
	p.mu.Unlock()
	return nil
}

func (p *peerLease) Release(ctx context.Context) error {
	if ctx.Err() != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
	}
	err := p.release(ctx)
	p.once.Do(func() { close(p.done) })
	return err
}
