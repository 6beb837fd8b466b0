package redlockstore_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/idem/idemtest"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/lock/locktest"
	"github.com/oncekit/oncekit/core/observe"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/storage/redlockstore"
)

func TestMain(m *testing.M) {
	// A holder process of the lock suite, a runner process of the idem suite.
	newStore := func() (*redlockstore.Store, error) {
		addrs, err := testenv.HolderAddrs("REDIS_ADDRS", 5)
		if err != nil {
			return nil, err
		}
		var cs []*redis.Client
		for _, a := range addrs {
			cs = append(cs, redis.NewClient(&redis.Options{Addr: a}))
		}
		return redlockstore.New(redlockstore.FromClients(cs...))
	}
	locktest.RunHolder(func() (lock.Locker, error) { return newStore() })
	idemtest.RunRunner(func() (idemdriver.Store, error) { return newStore() })
	testenv.QuietRedisDialErrors() // the fault tests stop servers on purpose
	goleak.VerifyTestMain(m,
		// go-redis retries a failed dial (a server the fault tests stopped)
		// in a goroutine that sleeps a second between attempts and ends
		// at its next wake-up once the client is closed.
		goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"))
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
	t.Parallel()
	addrs := testenv.RedisAddrs(t, 5)[:5]
	for _, mode := range []struct {
		name string
		opts []redlockstore.Option
	}{
		{"fenced", nil},
		{"unfenced", []redlockstore.Option{redlockstore.WithoutFencing()}},
	} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			var counters sync.Map // lock.Locker -> *counter
			cfg := locktest.Config{
				NewLocker: func(t *testing.T) lock.Locker {
					rt := &counter{}
					// The suite checks what a lock does, not how fast: a
					// fresh Store's first round dials five nodes, which
					// under a -race run of every package on two cores
					// outlasted the default node timeout of a 1 s TTL
					// (100 ms). The node timeout has tests of its own.
					opts := append([]redlockstore.Option{redlockstore.WithNodeTimeout(500 * time.Millisecond)}, mode.opts...)
					s := newStore(t, clients(t, addrs, rt), opts...)
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

// names records the names of the commands a client sends about keys
// containing match.
type names struct {
	mu    sync.Mutex
	match string
	got   []string
}

func (n *names) note(cmd redis.Cmder) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, a := range cmd.Args() {
		if s, ok := a.(string); ok && n.match != "" && strings.Contains(s, n.match) {
			n.got = append(n.got, cmd.Name())
			return
		}
	}
}

func (n *names) DialHook(next redis.DialHook) redis.DialHook { return next }

func (n *names) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		n.note(cmd)
		return next(ctx, cmd)
	}
}

func (n *names) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			n.note(c)
		}
		return next(ctx, cmds)
	}
}

func (n *names) take() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.got
}

// Unfenced, a new key is taken with one plain SET NX per node, as redsync
// takes it; fenced, the script reads each node's clock for the fence.
func TestUnfencedNewKeyPlainSet(t *testing.T) {
	addrs := testenv.RedisAddrs(t, 5)[:5]
	for _, mode := range []struct {
		name string
		opts []redlockstore.Option
		want string
	}{
		{"unfenced", []redlockstore.Option{redlockstore.WithoutFencing()}, "set"},
		{"fenced", nil, "evalsha"},
	} {
		t.Run(mode.name, func(t *testing.T) {
			key := fmt.Sprintf("plain-%d", time.Now().UnixNano())
			n := names{match: key}
			s := newStore(t, clients(t, addrs, &n), mode.opts...)
			ctx := context.Background()
			testenv.AcquireRelease(ctx, t, s, "warm-"+key, time.Second) // scripts loaded
			time.Sleep(50 * time.Millisecond)
			n.mu.Lock()
			n.got = nil
			n.match = "{" + key + "}" // the new key's names only
			n.mu.Unlock()
			l, err := s.Acquire(ctx, key, 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Release(ctx)
			time.Sleep(50 * time.Millisecond) // the nodes that answered after the majority
			got := n.take()
			if len(got) != len(addrs) || slices.ContainsFunc(got, func(c string) bool { return c != mode.want }) {
				t.Errorf("a new key sent %v, want one %s per node", got, mode.want)
			}
		})
	}
}

// A fenced release reads a node's clock only when it cannot tell that the
// node's clock has passed the hold's fence: the hold's fence is the
// highest of the nodes' clocks when they took the key, and a node that
// read its clock earlier has it from the time passed since its answer
// came. Five servers of the test's own, so that INFO commandstats counts
// only this test's TIME calls: one per node to take a new key, none more
// to release it — also at once, when the nodes that answered after the
// majority are released once their answers have come — and one script
// per node each way.
func TestFencedReleaseSkipsClockRead(t *testing.T) {
	var addrs []string
	for range 5 {
		addrs = append(addrs, testenv.StartRedis(t).Addr)
	}
	cs := clients(t, addrs)
	s := newStore(t, cs)
	ctx := context.Background()
	calls := func(cmd string) (n int) {
		for _, c := range cs {
			info, err := c.(*redis.Client).Info(ctx, "commandstats").Result()
			if err != nil {
				t.Fatal(err)
			}
			for line := range strings.Lines(info) {
				if rest, ok := strings.CutPrefix(line, "cmdstat_"+cmd+":calls="); ok {
					var k int
					fmt.Sscanf(rest, "%d", &k)
					n += k
				}
			}
		}
		return n
	}
	testenv.AcquireRelease(ctx, t, s, "warm", time.Second) // scripts loaded, clocks measured
	time.Sleep(50 * time.Millisecond)
	// A node whose answer the client gave up on (a machine loaded by a
	// parallel make test) is released as one whose take is not known,
	// which reads its clock: each case gets three tries, and one must
	// count exactly. (A release that read the clock every time fails all
	// three.)
	for _, hold := range []time.Duration{20 * time.Millisecond, 0} {
		var counts []string
		var l lock.Lease
		var key string
		for try := range 3 {
			key = fmt.Sprintf("clock-%s-%d", hold, try)
			time0, eval0 := calls("time"), calls("evalsha")
			var err error
			l, err = s.Acquire(ctx, key, 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(hold)
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
			time.Sleep(50 * time.Millisecond) // the nodes that answered after the majority
			times, evals := calls("time")-time0, calls("evalsha")-eval0
			if times == len(addrs) && evals == 2*len(addrs) {
				counts = nil
				break
			}
			counts = append(counts, fmt.Sprintf("%d clock reads and %d scripts", times, evals))
		}
		if counts != nil {
			t.Errorf("hold %s: a fenced new key and its release made %s; want %d clock reads (once per node, to take it) and %d scripts (one take and one release per node)",
				hold, strings.Join(counts, ", then "), len(addrs), 2*len(addrs))
		}
		// And the fences still go forward on every node: a new holder's is above.
		next, err := s.Acquire(ctx, key, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if next.Fence() <= l.Fence() {
			t.Errorf("hold %s: fence after the release %d, not above %d", hold, next.Fence(), l.Fence())
		}
		next.Release(ctx)
	}
}
