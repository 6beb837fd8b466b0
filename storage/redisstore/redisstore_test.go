package redisstore_test

import (
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/idem/idemtest"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/lock/locktest"
	"github.com/oncekit/oncekit/core/observe"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/stock/stockdriver"
	"github.com/oncekit/oncekit/stock/stocktest"
	"github.com/oncekit/oncekit/storage/redisstore"
)

func TestMain(m *testing.M) {
	// A holder process of the lock suite, a runner process of the idem suite.
	newStore := func() (*redisstore.Store, error) {
		addrs, err := testenv.HolderAddrs("REDIS_ADDRS", 1)
		if err != nil {
			return nil, err
		}
		return redisstore.New(redis.NewClient(&redis.Options{Addr: addrs[0]}))
	}
	locktest.RunHolder(func() (lock.Locker, error) { return newStore() })
	idemtest.RunRunner(func() (idemdriver.Store, error) { return newStore() })
	stocktest.RunWorker(func() (stockdriver.Store, error) { return newStore() })
	testenv.QuietRedisDialErrors() // the fault tests stop servers on purpose
	goleak.VerifyTestMain(m,
		// go-redis retries a failed dial (a server the fault tests stopped)
		// in a goroutine that sleeps a second between attempts and ends
		// at its next wake-up once the client is closed.
		goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"))
}

// counter counts a client's requests (connection set-up excluded).
type counter = testenv.RedisCounter

// newClient returns a client of the first test server, closed at cleanup,
// configured as the README recommends (ContextTimeoutEnabled, so bounded
// calls run on the caller's goroutine); the fault tests' privateClient
// keeps go-redis' defaults, so both ways are tested.
func newClient(t testing.TB, hooks ...redis.Hook) *redis.Client {
	t.Helper()
	addr := testenv.RedisAddrs(t, 1)[0]
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
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
	t.Parallel()
	for _, mode := range []struct {
		name     string
		pubsub   redisstore.PubSubMode
		unfenced bool
	}{
		{"auto", redisstore.PubSubAuto, false},
		{"classic", redisstore.PubSubClassic, false},
		{"unfenced", redisstore.PubSubAuto, true},
	} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			opts := []redisstore.Option{redisstore.WithPubSub(mode.pubsub)}
			if mode.unfenced {
				opts = append(opts, redisstore.WithoutFencing())
			}
			var counters sync.Map // lock.Locker -> *counter
			locktest.Run(t, locktest.Config{
				// Every Locker is a client of its own, as separate processes are.
				NewLocker: func(t *testing.T) lock.Locker {
					c := &counter{}
					s := newStore(t, newClient(t, c), opts...)
					counters.Store(lock.Locker(s), c)
					return s
				},
				RoundTrips:    func(l lock.Locker) int64 { c, _ := counters.Load(l); return c.(*counter).N.Load() },
				Reentrant:     true,
				FenceAtLeast:  true, // InspectLock reports the hold's last fence
				Unfenced:      mode.unfenced,
				HolderProcess: mode.name == "auto",
			})
		})
	}
}

// A waiter reports the hand-off: from another process's release notice,
// and from a release of its own Store.
func TestHandOffReported(t *testing.T) {
	t.Run("notified", func(t *testing.T) {
		ev := testenv.NewEvents()
		testenv.CheckHandOff(t, newStore(t, newClient(t)), newStore(t, newClient(t), redisstore.WithObserver(ev)), ev, observe.Notified)
	})
	t.Run("local", func(t *testing.T) {
		ev := testenv.NewEvents()
		s := newStore(t, newClient(t), redisstore.WithObserver(ev))
		testenv.CheckHandOff(t, s, s, ev, observe.Local)
	})
}

// PubSubMode is redisstore's own type, each mode reaching the subscriber
// as the mode it names.
func TestPubSubModeNames(t *testing.T) {
	for m, want := range map[redisstore.PubSubMode]string{redisstore.PubSubAuto: "auto", redisstore.PubSubSharded: "sharded",
		redisstore.PubSubClassic: "classic", redisstore.PubSubOff: "off"} {
		if m.String() != want {
			t.Errorf("%d.String() = %q, want %q", int(m), m.String(), want)
		}
	}
}
