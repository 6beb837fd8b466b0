package etcdstore_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/storage/etcdstore"
)

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

func endpoints(ms []*testenv.EtcdMember) []string {
	var eps []string
	for _, m := range ms {
		eps = append(eps, strings.TrimPrefix(m.Endpoint, "http://"))
	}
	return eps
}

// The single server stopped while a lease is held: Done closes within the
// TTL, Acquire fails with a clear error at its deadline, and service
// resumes once the server is back.
func TestServerStopped(t *testing.T) {
	ms := testenv.StartEtcdCluster(t, 1)
	s := newStore(t, newClient(t, endpoints(ms)))
	const ttl = time.Second
	lease, err := s.Acquire(ctxT(t, 5*time.Second), "stopped", ttl)
	if err != nil {
		t.Fatal(err)
	}
	done := lease.Done()
	killed := time.Now()
	ms[0].Kill()

	select {
	case <-done:
	case <-time.After(time.Until(killed.Add(ttl + 500*time.Millisecond))):
		t.Fatal("Done still open 500ms after the TTL with the server down")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	_, err = s.Acquire(ctx, "other", ttl)
	cancel()
	if !errors.Is(err, lock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "etcdstore: acquire") {
		t.Errorf("Acquire with the server down: %v, want an etcdstore error matching ErrNotAcquired and DeadlineExceeded", err)
	}

	ms[0].Restart()
	ms[0].WaitHealthy()
	// A long TTL: under a loaded scheduler a 1 s lease could run out
	// between this Acquire and its Release.
	l2, err := s.Acquire(ctxT(t, 15*time.Second), "stopped", 30*time.Second)
	if err != nil {
		t.Fatalf("Acquire after the server came back: %v", err)
	}
	if l2.Fence() <= lease.Fence() {
		t.Errorf("fence after restart %d not above %d", l2.Fence(), lease.Fence())
	}
	if err := l2.Release(ctxT(t, 5*time.Second)); err != nil {
		t.Fatalf("Release after restart: %v", err)
	}
}

// The leader of a three-member cluster killed while clients contend:
// locking goes on and exclusion holds.
func TestLeaderKilled(t *testing.T) {
	ms := testenv.StartEtcdCluster(t, 3)
	eps := endpoints(ms)
	admin := newClient(t, eps)
	stores := []*etcdstore.Store{}
	for range 3 {
		stores = append(stores, newStore(t, newClient(t, eps)))
	}
	const target = 150
	var (
		successes, failures  atomic.Int64
		inside, overlaps     atomic.Int64
		counter              atomic.Int64
		last                 atomic.Uint64
		badFences            atomic.Int64
		wg                   sync.WaitGroup
		killedAt, firstAfter atomic.Int64
		freedAt, maxGap      atomic.Int64 // when the last holder let go; the longest wait after the kill (ns)
	)
	ctx := ctxT(t, 2*time.Minute)
	for g := range 6 {
		wg.Go(func() {
			s := stores[g%len(stores)]
			for successes.Load() < target && ctx.Err() == nil {
				actx, cancel := context.WithTimeout(ctx, 5*time.Second)
				l, err := s.Acquire(actx, "leader-killed", 5*time.Second)
				cancel()
				if err != nil {
					failures.Add(1) // a request cut by the election: try again
					time.Sleep(20 * time.Millisecond)
					time.Sleep(20 * time.Millisecond)
					continue
				}
				if inside.Add(1) != 1 {
					overlaps.Add(1)
				}
				if killedAt.Load() != 0 {
					if gap := time.Now().UnixNano() - freedAt.Load(); gap > maxGap.Load() {
						maxGap.Store(gap)
					}
				}
				if f := l.Fence(); f <= last.Load() {
					badFences.Add(1)
				} else {
					last.Store(f)
				}
				v := counter.Load()
				time.Sleep(time.Millisecond)
				counter.Store(v + 1)
				freedAt.Store(time.Now().UnixNano())
				inside.Add(-1)
				n := successes.Add(1)
				if killedAt.Load() != 0 && firstAfter.Load() == 0 {
					firstAfter.Store(n)
				}
				_ = l.Release(ctx)
			}
		})
	}
	for successes.Load() < target/3 && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	leader := findLeader(t, admin, ms)
	leader.Kill()
	killedAt.Store(successes.Load())
	wg.Wait()
	t.Logf("leader %s killed after %d acquisitions; %d failed attempts around the election", leader.Name, killedAt.Load(), failures.Load())
	if successes.Load() < target {
		t.Fatalf("only %d acquisitions", successes.Load())
	}
	if firstAfter.Load() == 0 {
		t.Fatal("no acquisition after the leader was killed")
	}
	if got := counter.Load(); got != successes.Load() {
		t.Errorf("counter %d after %d acquisitions: holders overlapped", got, successes.Load())
	}
	if overlaps.Load() != 0 || badFences.Load() != 0 {
		t.Errorf("%d overlaps, %d fences out of order", overlaps.Load(), badFences.Load())
	}
	// A Release cut by the election is retried; a released entry never
	// blocks the queue until its lease runs out.
	gap := time.Duration(maxGap.Load())
	t.Logf("longest time without a holder after the kill: %s", gap.Round(time.Millisecond))
	if gap > 2500*time.Millisecond {
		t.Errorf("the key stayed free for %s after the leader was killed; want under ~2 s", gap.Round(time.Millisecond))
	}
}

func findLeader(t *testing.T, c *clientv3.Client, ms []*testenv.EtcdMember) *testenv.EtcdMember {
	t.Helper()
	for _, m := range ms {
		st, err := c.Status(ctxT(t, 5*time.Second), strings.TrimPrefix(m.Endpoint, "http://"))
		if err == nil && st.Leader == st.Header.MemberId {
			return m
		}
	}
	t.Fatal("no leader found")
	return nil
}

func TestNewValidates(t *testing.T) {
	if _, err := etcdstore.New(nil); err == nil {
		t.Error("New(nil): no error")
	}
	c := newClient(t, []string{"127.0.0.1:1"})
	for name, opt := range map[string]etcdstore.Option{
		"empty prefix": etcdstore.WithPrefix(""),
	} {
		if _, err := etcdstore.New(c, opt); err == nil {
			t.Errorf("New with a bad %s: no error", name)
		}
	}
}

// Keys that are prefixes of each other in path form never share a queue.
func TestKeysDoNotNest(t *testing.T) {
	s := newStore(t, newClient(t, testenv.EtcdAddrs(t)))
	ctx := ctxT(t, 5*time.Second)
	a, err := s.TryAcquire(ctx, "nest", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Release(ctx)
	b, err := s.TryAcquire(ctx, "nest/child", time.Second)
	if err != nil {
		t.Fatalf("TryAcquire of nest/child while nest is held: %v", err)
	}
	b.Release(ctx)
}

// proxy forwards TCP connections to target until cut, which closes every
// connection and refuses new ones: a client cut off from the servers.
type proxy struct {
	ln     net.Listener
	mu     sync.Mutex
	conns  []net.Conn
	closed bool
}

func newProxy(t *testing.T, target string) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			if p.closed {
				p.mu.Unlock()
				c.Close()
				up.Close()
				return
			}
			p.conns = append(p.conns, c, up)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(up, c); up.Close() }()
			go func() { _, _ = io.Copy(c, up); c.Close() }()
		}
	}()
	t.Cleanup(p.cut)
	return p
}

func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	p.ln.Close()
	for _, c := range p.conns {
		c.Close()
	}
}

// A holder cut off from etcd learns it lost the key (Done closes) before
// the server frees it for anyone else: its session's validity counts from
// when each keep-alive was sent, never from when the answer arrived.
func TestCutOffHolderKnowsFirst(t *testing.T) {
	eps := testenv.EtcdAddrs(t)
	p := newProxy(t, strings.TrimPrefix(eps[0], "http://"))
	holder := newStore(t, newClient(t, []string{"http://" + p.ln.Addr().String()}))
	other := newStore(t, newClient(t, eps))
	m, err := lock.NewMutex(holder, lock.WithTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 30*time.Second)
	key := "cut-off-" + time.Now().Format("150405.000000")
	h, err := m.Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // keep-alives and refreshes flowing
	leaseDeadline := h.Deadline()
	cutAt := time.Now()
	p.cut()
	lost := make(chan time.Time, 1)
	go func() { <-h.Lost(); lost <- time.Now() }()
	l, err := other.Acquire(ctx, key, time.Second)
	if err != nil {
		t.Fatalf("Acquire after the holder was cut off: %v", err)
	}
	taken := time.Now()
	defer l.Release(context.Background())
	select {
	case at := <-lost:
		t.Logf("cut at 0; lease deadline %s; lost at %s; taken by another at %s",
			leaseDeadline.Sub(cutAt), at.Sub(cutAt), taken.Sub(cutAt))
		if at.After(taken) {
			t.Errorf("the cut-off holder learned of its loss %s after another client took the key", at.Sub(taken))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the cut-off holder never learned it lost the key")
	}
}

// A holder whose heartbeats stop loses its key to a waiter a TTL after its
// last heartbeat, even while its session lease lives on in etcd (here kept
// alive by another client; in life, a leader's lessor that is slow to
// expire it): the waiter deletes the entry, and only after the holder has
// learned it lost the key.
func TestStaleHeartbeatFreesKey(t *testing.T) {
	eps := testenv.EtcdAddrs(t)
	p := newProxy(t, strings.TrimPrefix(eps[0], "http://"))
	holder := newStore(t, newClient(t, []string{"http://" + p.ln.Addr().String()}))
	admin := newClient(t, eps)
	waiter := newStore(t, newClient(t, eps))
	ctx := ctxT(t, 30*time.Second)
	key := "stale-heartbeat-" + time.Now().Format("150405.000000")
	h, err := holder.Acquire(ctx, key, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	entries, err := admin.Get(ctx, "oncekit/lock/"+key+"/", clientv3.WithPrefix())
	if err != nil || len(entries.Kvs) != 1 {
		t.Fatalf("the holder's entry: %v, %v", entries, err)
	}
	session := clientv3.LeaseID(entries.Kvs[0].Lease)
	alive, err := admin.KeepAlive(ctx, session) // the server never expires it
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for range alive {
		}
	}()

	lost := make(chan time.Time, 1)
	go func() { <-h.Done(); lost <- time.Now() }()
	cutAt := time.Now()
	p.cut() // the holder's keep-alives and heartbeats stop
	l, err := waiter.Acquire(ctx, key, time.Second)
	if err != nil {
		t.Fatalf("Acquire behind a holder whose heartbeats stopped: %v", err)
	}
	taken := time.Now()
	defer l.Release(context.Background())
	ttl, err := admin.TimeToLive(ctx, session)
	if err != nil || ttl.TTL <= 0 {
		t.Fatalf("the holder's session lease should still be alive in etcd: %v, %v", ttl, err)
	}
	if l.Fence() <= h.Fence() {
		t.Errorf("fence %d after the dead holder's %d", l.Fence(), h.Fence())
	}
	select {
	case at := <-lost:
		t.Logf("cut at 0; holder lost at %s; key taken at %s (session TTL %d s)", at.Sub(cutAt), taken.Sub(cutAt), ttl.GrantedTTL)
		if at.After(taken) {
			t.Errorf("the holder learned of its loss %s after the waiter took the key", at.Sub(taken))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the holder never learned it lost the key")
	}
}

// A kept entry's delete sent to a member that cannot answer (paused here;
// in production, a member cut off in the middle of an election) is tried
// again on another member after one short attempt: the next process gets
// the key within about a second, not after the whole release budget.
func TestLetGoRetriesPastStalledMember(t *testing.T) {
	ms := testenv.StartEtcdCluster(t, 3)
	leader := findLeader(t, newClient(t, endpoints(ms)), ms)
	var stalled *testenv.EtcdMember
	for _, m := range ms {
		if m != leader {
			stalled = m
			break
		}
	}
	// a's client takes turns between the leader and the member paused
	// below; b only talks to the leader.
	ca := newClient(t, endpoints([]*testenv.EtcdMember{leader, stalled}))
	a := newStore(t, ca, etcdstore.WithLinger(50*time.Millisecond))
	b := newStore(t, newClient(t, endpoints([]*testenv.EtcdMember{leader})))
	const attempt = time.Second // the drivers' single-attempt timeout
	stalls := 0
	for i := 0; i < 40 && stalls < 3; i++ {
		key := fmt.Sprintf("stalled-%d", i)
		for range 2 { // taken again at once: hot, and its last Release kept
			testenv.AcquireRelease(ctxT(t, 10*time.Second), t, a, key, 10*time.Second)
		}
		// A cycle makes a fixed number of requests; one more, at random,
		// sends the delete to either member.
		if rand.IntN(2) == 0 {
			if _, err := ca.Get(ctxT(t, 10*time.Second), "turn"); err != nil {
				t.Fatal(err)
			}
		}
		stalled.Pause()
		start := time.Now()
		l, err := b.Acquire(ctxT(t, 20*time.Second), key, 10*time.Second)
		waited := time.Since(start)
		stalled.Resume()
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctxT(t, 10*time.Second)); err != nil {
			t.Fatal(err)
		}
		if waited > 3*attempt {
			t.Fatalf("cycle %d: the kept entry blocked the key for %s with one member paused; want about one attempt (%s)", i, waited.Round(time.Millisecond), attempt)
		}
		if waited >= attempt*9/10 {
			stalls++ // the delete went to the paused member first
		}
	}
	if stalls == 0 {
		t.Fatal("no delete in 40 cycles went to the paused member: the test proved nothing")
	}
}

// A run whose Store loses its connection mid-run (held by a partition, not
// closed) ends before another process can claim its key: the Guard's own
// timer ends it at the claim's validity, which is also bounded by the
// session lease its entry is bound to.
func TestRunEndsWhenConnectionCut(t *testing.T) {
	eps := testenv.EtcdAddrs(t)
	p := testenv.StartProxy(t, eps[0])
	testenv.CheckRunEndsWhenCut(t, newStore(t, newClient(t, []string{p.Addr})), newStore(t, newClient(t, eps)), p)
}

// A lease's Deadline is capped by its session's validity: a lease
// refreshed for longer than the session's TTL, on a session whose
// keep-alives stopped reaching the server, is valid only as long as the
// session.
func TestDeadlineCappedBySession(t *testing.T) {
	eps := testenv.EtcdAddrs(t)
	p := testenv.StartProxy(t, eps[0])
	s := newStore(t, newClient(t, []string{p.Addr}))
	ctx := t.Context()
	key := "deadline-session-" + time.Now().Format("150405.000000")
	l, err := s.Acquire(ctx, key, time.Second) // a session of the 1 s class
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(context.Background())
	if err := l.Refresh(ctx, 30*time.Second); err != nil { // longer than the session's TTL
		t.Fatal(err)
	}
	cut := time.Now()
	p.Stall()
	defer p.Resume()
	if d := l.Deadline(); !d.IsZero() && d.Sub(cut) > 2*time.Second {
		t.Errorf("with the session's keep-alives cut, Deadline is %s away; the session it lives on ends within its TTL",
			d.Sub(cut).Round(time.Millisecond))
	}
}
