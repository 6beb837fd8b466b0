package zkstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"go.uber.org/goleak"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/idem/idemtest"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/lock/locktest"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/stock/stockdriver"
	"github.com/oncekit/oncekit/stock/stocktest"
	"github.com/oncekit/oncekit/storage/zkstore"
)

// sessionTimeout is the tests' session: short, so that a killed holder's
// key frees within the suites' bounds, and long enough for a -race run's
// pauses on two cores.
const sessionTimeout = 2 * time.Second

func TestMain(m *testing.M) {
	// A holder process of the lock suite, a runner process of the idem suite.
	newStore := func() (*zkstore.Store, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return zkstore.Connect(ctx, testenv.Addrs("ZOOKEEPER_ADDRS"), zkstore.WithSessionTimeout(sessionTimeout))
	}
	locktest.RunHolder(func() (lock.Locker, error) { return newStore() })
	idemtest.RunRunner(func() (idemdriver.Store, error) { return newStore() })
	stocktest.RunWorker(func() (stockdriver.Store, error) { return newStore() })
	goleak.VerifyTestMain(m)
}

// connect returns a Store with a session of its own (as another process
// would have), closed at the end of the test.
func connect(t testing.TB, opts ...zkstore.Option) *zkstore.Store {
	t.Helper()
	addrs := testenv.ZooKeeperAddrs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := zkstore.Connect(ctx, addrs, append([]zkstore.Option{zkstore.WithSessionTimeout(sessionTimeout)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestConformance(t *testing.T) {
	t.Parallel()
	locktest.Run(t, locktest.Config{
		NewLocker:     func(t *testing.T) lock.Locker { return connect(t) },
		Reentrant:     true,
		HolderProcess: true,
	})
}

func TestIdemConformance(t *testing.T) {
	t.Parallel()
	admin := connect(t)
	idemtest.Run(t, idemtest.Config{
		NewStore:      func(t *testing.T) idemdriver.Store { return connect(t) },
		RunnerProcess: true,
		Corrupt: func(t *testing.T, key string) {
			p := zkstore.RecordPath(admin, key)
			if _, err := admin.Begin(context.Background(), idemdriver.MustKey(key), "plant", time.Minute); err != nil {
				t.Fatal(err) // creates the bucket directory
			}
			if _, err := admin.Conn().Set(p, []byte("garbage"), -1); err != nil && err != zk.ErrNoNode {
				t.Fatal(err)
			}
		},
		Effect: func(t *testing.T, key string, limit int) (any, func() int) {
			return countingEffect(t, admin.Conn(), key, limit)
		},
	})
}

// countingEffect is an effect that adds one child to a node of its own
// for key — refused (a version check on a node that does not exist) when
// limit is 0 — and a function that counts the children.
func countingEffect(t *testing.T, c *zk.Conn, key string, limit int) (zkstore.Effect, func() int) {
	dir := "/oncekit-test-effects/" + strings.NewReplacer("/", "_", ".", "_").Replace(key)
	for _, p := range []string{"/oncekit-test-effects", dir} {
		if _, err := c.Create(p, nil, 0, zk.WorldACL(zk.PermAll)); err != nil && err != zk.ErrNodeExists {
			t.Fatal(err)
		}
	}
	ops := []any{&zk.CreateRequest{Path: dir + "/n-", Acl: zk.WorldACL(zk.PermAll), Flags: zk.FlagSequence}}
	if limit <= 0 {
		ops = append(ops, &zk.CheckVersionRequest{Path: dir + "/limit-reached", Version: 0})
	}
	count := func() int {
		kids, _, err := c.Children(dir)
		if err != nil {
			t.Fatal(err)
		}
		return len(kids)
	}
	return zkstore.Effect{Ops: ops, Reason: "limit reached"}, count
}

// An owner's re-entry outlives the hold it joined: a waiter queued behind
// the first hold does not take the key when that hold is released, only
// when the re-entry is; and its fence is above the owner's.
func TestReentryOutlivesFirstHold(t *testing.T) {
	key := "reentry-" + time.Now().Format(time.RFC3339Nano)
	owner := lock.WithOwner(ctxT(t, 20*time.Second), "job-1")
	first, err := connect(t).Acquire(owner, key, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	waiter := make(chan lock.Lease, 1)
	go func() {
		l, err := connect(t).Acquire(ctxT(t, 20*time.Second), key, time.Minute)
		if err != nil {
			t.Error(err)
		}
		waiter <- l
	}()
	time.Sleep(200 * time.Millisecond) // the waiter queues
	again, err := connect(t).Acquire(owner, key, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if again.Fence() != first.Fence() || again.Token() != first.Token() {
		t.Fatalf("re-entry: fence %d token %s, want the first hold's %d %s", again.Fence(), again.Token(), first.Fence(), first.Token())
	}
	if err := first.Release(ctxT(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	select {
	case l := <-waiter:
		t.Fatalf("the waiter took the key (fence %d) while the owner's re-entry holds it", l.Fence())
	case <-time.After(500 * time.Millisecond):
	}
	if err := again.Release(ctxT(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	select {
	case l := <-waiter:
		if l == nil {
			return
		}
		defer l.Release(context.Background())
		if l.Fence() <= first.Fence() {
			t.Errorf("the waiter's fence %d is not above the owner's %d", l.Fence(), first.Fence())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter did not get the key after the last hold was released")
	}
}

// Cleanup deletes the records whose retention ended, by the servers'
// clock, and leaves live ones; InspectRecord already reports an expired
// record as gone.
func TestCleanupDeletesExpiredRecords(t *testing.T) {
	s := connect(t, zkstore.WithRoot("/oncekit-cleanup-test-"+strings.ReplaceAll(time.Now().Format("150405.000000"), ".", "")))
	ctx := ctxT(t, 30*time.Second)
	for i, retention := range []time.Duration{50 * time.Millisecond, time.Hour} {
		key := "k" + string(rune('a'+i))
		c, err := s.Begin(ctx, idemdriver.MustKey(key), "fp", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Complete(ctx, c, []byte("r"), retention); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(200 * time.Millisecond)
	if info, err := s.InspectRecord(ctx, "ka"); err != nil || info.Found {
		t.Errorf("InspectRecord of an expired record: %+v %v, want not found", info, err)
	}
	n, err := s.Cleanup(ctx)
	if err != nil || n != 1 {
		t.Fatalf("Cleanup: %d deleted, %v; want 1", n, err)
	}
	if _, _, err := s.Conn().Get(zkstore.RecordPath(s, "ka")); err == nil {
		t.Error("the expired record's node is still there")
	}
	if info, err := s.InspectRecord(ctx, "kb"); err != nil || !info.Found || info.State != idemdriver.Completed {
		t.Errorf("the live record after Cleanup: %+v %v", info, err)
	}
}

// A completion whose effect would make the request larger than ZooKeeper
// accepts (jute.maxbuffer, 1 MiB) fails as an answer before it is sent:
// sent, it dropped the session's connection, and every retry again, which
// ended the Store's leases each time. The claim stays the run's, and the
// session keeps working.
func TestOversizedEffectRefusedBeforeSending(t *testing.T) {
	s := connect(t)
	ctx := t.Context()
	key := "oversized-" + time.Now().Format("150405.000000")
	c, err := s.Begin(ctx, idemdriver.MustKey(key), "fp", 10*time.Second)
	if err != nil || c.State != idemdriver.Acquired {
		t.Fatalf("Begin: %+v %v", c, err)
	}
	held, err := s.Acquire(ctx, key+"-lock", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(context.Background())
	big := make([]byte, 600<<10)
	effect := zkstore.Effect{Ops: []any{&zk.CreateRequest{Path: "/oncekit-oversized-" + time.Now().Format("150405.000000"),
		Data: big, Acl: zk.WorldACL(zk.PermAll)}}}
	err = s.CompleteWith(ctx, c, make([]byte, 500<<10), time.Minute, effect)
	var failed *idem.EffectFailedError
	if !errors.As(err, &failed) || !strings.Contains(err.Error(), "request limit") {
		t.Fatalf("CompleteWith of a 1.1 MB request = %v, want an EffectFailedError naming the request limit", err)
	}
	select {
	case <-held.Done():
		t.Fatal("the session's lease ended: the request was sent and dropped the connection")
	default:
	}
	if err := s.Complete(ctx, c, []byte("small"), time.Minute); err != nil {
		t.Fatalf("Complete after the refused effect: %v", err)
	}
}

// The Store's own liveness clock: while it holds a lease it asks the
// ensemble something every sixth of the session timeout, and when nothing
// was answered for two thirds of it the lease ends — before the servers
// could expire the session and hand the key on, however late the client
// library reports the connection lost (a send blocked in a large write
// delays that to about 4/3 of the timeout). The stall is made by holding
// the Store's liveness requests back; the connection itself stays up, so
// only the Store's clock can end the lease.
func TestLivenessClockEndsLeases(t *testing.T) {
	s := connect(t)
	ctx := t.Context()
	key := "liveness-" + time.Now().Format("150405.000000")
	l, err := s.Acquire(ctx, key, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(context.Background())
	// Answered pings keep an idle lease alive past the silence bound.
	time.Sleep(sessionTimeout)
	select {
	case <-l.Done():
		t.Fatal("an idle lease ended while the ensemble answered")
	default:
	}
	release := make(chan struct{})
	defer close(release)
	stalled := time.Now()
	zkstore.StallPings(s, release)
	select {
	case <-l.Done():
		if d := time.Since(stalled); d > sessionTimeout {
			t.Errorf("the lease ended %s after the ensemble stopped answering, want within 2/3 of the %s session timeout (and a tick)", d, sessionTimeout)
		}
	case <-time.After(4 * sessionTimeout / 3):
		t.Fatal("the lease outlived 4/3 of the session timeout with nothing answered")
	}
}
