package redisstore_test

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/lock/locktest"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/storage/redisstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// counter is a go-redis hook that counts requests sent to the server,
// except those that set up a connection.
type counter struct{ n atomic.Int64 }

// setup reports whether cmd is part of a connection's set-up (HELLO,
// CLIENT SETINFO, CLIENT MAINT_NOTIFICATIONS), which go-redis sends once
// per new connection.
func setup(cmd redis.Cmder) bool { n := cmd.Name(); return n == "hello" || n == "client" }

func (c *counter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *counter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !setup(cmd) {
			c.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (c *counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if !slices.ContainsFunc(cmds, func(c redis.Cmder) bool { return !setup(c) }) {
			return next(ctx, cmds) // connection set-up only
		}
		c.n.Add(1)
		return next(ctx, cmds)
	}
}

// newClient returns a client of the first test server, closed at cleanup.
func newClient(t testing.TB, hooks ...redis.Hook) *redis.Client {
	t.Helper()
	addr := testenv.RedisAddrs(t, 1)[0]
	c := redis.NewClient(&redis.Options{Addr: addr})
	for _, h := range hooks {
		c.AddHook(h)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func newStore(t testing.TB, c redisstore.Client, opts ...redisstore.Option) *redisstore.Store {
	t.Helper()
	s, err := redisstore.New(c, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestConformance(t *testing.T) {
	for _, mode := range []redisstore.PubSubMode{redisstore.PubSubAuto, redisstore.PubSubClassic} {
		t.Run(mode.String(), func(t *testing.T) {
			var counters sync.Map // lock.Locker -> *counter
			locktest.Run(t, locktest.Config{
				// Every Locker is a client of its own, as separate processes are.
				NewLocker: func(t *testing.T) lock.Locker {
					c := &counter{}
					s := newStore(t, newClient(t, c), redisstore.WithPubSub(mode))
					counters.Store(lock.Locker(s), c)
					return s
				},
				RoundTrips: func(l lock.Locker) int64 { c, _ := counters.Load(l); return c.(*counter).n.Load() },
				Reentrant:  true,
			})
		})
	}
}
