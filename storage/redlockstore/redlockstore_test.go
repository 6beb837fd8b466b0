package redlockstore_test

import (
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/lock/locktest"
	"github.com/oncekit/oncekit/core/observe"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/storage/redlockstore"
)

func TestMain(m *testing.M) {
	locktest.RunHolder(func() (lock.Locker, error) { // a holder process of the suite
		addrs, err := testenv.HolderAddrs("REDIS_ADDRS", 5)
		if err != nil {
			return nil, err
		}
		var cs []*redis.Client
		for _, a := range addrs {
			cs = append(cs, redis.NewClient(&redis.Options{Addr: a}))
		}
		return redlockstore.New(redlockstore.FromClients(cs...))
	})
	testenv.QuietRedisDialErrors() // the fault tests stop servers on purpose
	goleak.VerifyTestMain(m)
}

// counter counts a client's requests (connection set-up excluded).
type counter = testenv.RedisCounter

// clients returns one new client per address, closed at cleanup,
// configured as the README recommends (ContextTimeoutEnabled); the fault
// tests' clients keep go-redis' defaults, so both ways are tested.
func clients(t testing.TB, addrs []string, hooks ...redis.Hook) []redlockstore.Client {
	t.Helper()
	cs := make([]redlockstore.Client, len(addrs))
	for i, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a, ContextTimeoutEnabled: true})
		for _, h := range hooks {
			c.AddHook(h)
		}
		t.Cleanup(func() { c.Close() })
		cs[i] = c
	}
	return cs
}

func newStore(t testing.TB, cs []redlockstore.Client, opts ...redlockstore.Option) *redlockstore.Store {
	t.Helper()
	s, err := redlockstore.New(cs, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestConformance(t *testing.T) {
	addrs := testenv.RedisAddrs(t, 5)[:5]
	for _, mode := range []struct {
		name string
		opts []redlockstore.Option
	}{
		{"fenced", nil},
		{"unfenced", []redlockstore.Option{redlockstore.WithoutFencing()}},
	} {
		t.Run(mode.name, func(t *testing.T) {
			var counters sync.Map // lock.Locker -> *counter
			cfg := locktest.Config{
				NewLocker: func(t *testing.T) lock.Locker {
					rt := &counter{}
					s := newStore(t, clients(t, addrs, rt), mode.opts...)
					counters.Store(lock.Locker(s), rt)
					return s
				},
				RoundTrips:        func(l lock.Locker) int64 { c, _ := counters.Load(l); return c.(*counter).N.Load() },
				RoundTripsPerCall: 5, // one request to each node, in parallel
				Settle:            50 * time.Millisecond,
				Reentrant:         true,
				FenceAtLeast:      true, // each node keeps its own fence
				// The local deadline is start + TTL − drift (1 % + 2 ms).
				ExpiresAfterDeadline: true,
				HolderProcess:        true,
			}
			if mode.name == "unfenced" {
				cfg.Unfenced = true
			}
			locktest.Run(t, cfg)
		})
	}
}

// A waiter reports the hand-off from the release notice.
func TestHandOffReported(t *testing.T) {
	addrs := testenv.RedisAddrs(t, 5)[:5]
	ev := testenv.NewEvents()
	testenv.CheckHandOff(t, newStore(t, clients(t, addrs)), newStore(t, clients(t, addrs), redlockstore.WithObserver(ev)), ev, observe.Notified)
}
