package redlockstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/storage/redlockstore"
)

// cluster is five private redis-server processes the test can stop, pause
// and restart.
type cluster struct {
	procs []*testenv.RedisProcess
	addrs []string
}

func newCluster(t *testing.T, n int) *cluster {
	c := &cluster{}
	for range n {
		p := testenv.StartRedis(t)
		c.procs = append(c.procs, p)
		c.addrs = append(c.addrs, p.Addr)
	}
	return c
}

// clients with go-redis' default timeouts; no retries so that a stopped node
// fails fast instead of being retried within a round.
func (c *cluster) clients(t *testing.T) []redlockstore.Client {
	cs := make([]redlockstore.Client, len(c.addrs))
	for i, a := range c.addrs {
		rc := redis.NewClient(&redis.Options{Addr: a, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
		t.Cleanup(func() { rc.Close() })
		cs[i] = rc
	}
	return cs
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// contend runs goroutines × cycles acquisitions of one key spread over
// lockers, and checks exclusion and fence order.
func contend(t *testing.T, lockers []lock.Locker, key string, goroutines, cycles int) {
	t.Helper()
	var (
		inside, overlaps, counter atomic.Int64
		last                      atomic.Uint64
		badFences                 atomic.Int64
		wg                        sync.WaitGroup
		errs                      = make(chan error, goroutines)
	)
	ctx := ctxT(t, time.Minute)
	for g := range goroutines {
		wg.Go(func() {
			l := lockers[g%len(lockers)]
			for range cycles {
				lease, err := l.Acquire(ctx, key, 2*time.Second)
				if err != nil {
					errs <- err
					return
				}
				if inside.Add(1) != 1 {
					overlaps.Add(1)
				}
				if f := lease.Fence(); f <= last.Load() {
					badFences.Add(1)
				} else {
					last.Store(f)
				}
				v := counter.Load()
				time.Sleep(time.Duration(rand.IntN(200)) * time.Microsecond)
				counter.Store(v + 1)
				inside.Add(-1)
				if err := lease.Release(ctx); err != nil && !errors.Is(err, redlockstore.ErrNoQuorum) {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("Acquire/Release: %v", err)
	}
	if got := counter.Load(); got != int64(goroutines*cycles) {
		t.Errorf("counter = %d, want %d", got, goroutines*cycles)
	}
	if overlaps.Load() != 0 || badFences.Load() != 0 {
		t.Errorf("%d overlaps, %d fences out of order", overlaps.Load(), badFences.Load())
	}
}

func lockers(t *testing.T, c *cluster, n int) []lock.Locker {
	ls := make([]lock.Locker, n)
	for i := range ls {
		ls[i] = newStore(t, c.clients(t))
	}
	return ls
}

// Two of five nodes paused (SIGSTOP: connections open, no answers) or shut
// down: locking goes on with exclusion and fence order intact.
func TestTwoNodesDown(t *testing.T) {
	for _, fault := range []string{"paused", "stopped"} {
		t.Run(fault, func(t *testing.T) {
			c := newCluster(t, 5)
			ls := lockers(t, c, 3)
			contend(t, ls, "warm", 3, 5)
			for _, p := range c.procs[3:] {
				if fault == "paused" {
					p.Pause()
					defer p.Resume()
				} else {
					p.Kill()
				}
			}
			contend(t, ls, "two-down", 4, 10)
		})
	}
}

// Three of five nodes down: no quorum. Acquire fails within its deadline
// with an error naming the failed nodes, never a false success; service
// comes back with the nodes.
func TestThreeNodesDown(t *testing.T) {
	c := newCluster(t, 5)
	s := newStore(t, c.clients(t))
	for _, p := range c.procs[2:] {
		p.Kill()
	}
	_, err := s.TryAcquire(ctxT(t, 5*time.Second), "three-down", time.Second)
	var qe *redlockstore.QuorumError
	if !errors.As(err, &qe) || !errors.Is(err, redlockstore.ErrNoQuorum) {
		t.Fatalf("TryAcquire with 3 of 5 down: %v, want a *QuorumError", err)
	}
	for _, p := range c.procs[2:] {
		if _, ok := qe.Failed[p.Addr]; !ok || !strings.Contains(err.Error(), p.Addr) {
			t.Errorf("error does not name failed node %s: %v", p.Addr, err)
		}
	}
	if len(qe.Failed) != 3 || qe.Got != 2 || qe.Need != 3 {
		t.Errorf("QuorumError = %+v, want 3 failed, got 2, need 3", qe)
	}

	start := time.Now()
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	lease, err := s.Acquire(ctx, "three-down", time.Second)
	if err == nil {
		lease.Release(context.Background())
		t.Fatal("Acquire without a quorum succeeded")
	}
	if !errors.Is(err, redlockstore.ErrNoQuorum) || !errors.Is(err, lock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Acquire without a quorum: %v, want ErrNoQuorum, ErrNotAcquired and DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Acquire with a 500ms deadline returned after %s", d)
	}

	for _, p := range c.procs[2:] {
		p.Start()
	}
	lease, err = s.Acquire(ctxT(t, 10*time.Second), "three-down", 10*time.Second)
	if err != nil {
		t.Fatalf("Acquire after the nodes came back: %v", err)
	}
	if err := lease.Release(ctxT(t, 5*time.Second)); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

// The delayed-restart rule: a node that restarts without its data may only
// rejoin once every lease it could have held has expired. Up to N−quorum
// nodes may restart empty at once without it: every majority still
// contains a node that kept the holder's key and fence.
func TestEmptyRestartOfTwoNodes(t *testing.T) {
	c := newCluster(t, 5)
	a, b := newStore(t, c.clients(t)), newStore(t, c.clients(t))
	holder, err := a.Acquire(ctxT(t, 5*time.Second), "restart", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	waitAll(t, c, "oncekit:redlock:{restart}") // the late replies have landed too
	for _, p := range c.procs[:2] {
		p.Kill()
		p.Start() // empty: no persistence
	}
	if _, err := b.TryAcquire(ctxT(t, 5*time.Second), "restart", time.Second); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("TryAcquire while 3 of 5 nodes keep the holder's key: %v, want ErrNotAcquired", err)
	}
	if err := holder.Refresh(ctxT(t, 5*time.Second), 10*time.Second); err != nil {
		t.Fatalf("holder's Refresh with 3 of 5 nodes: %v", err)
	}
	if err := holder.Release(ctxT(t, 5*time.Second)); err != nil {
		t.Fatalf("holder's Release: %v", err)
	}
	next, err := b.Acquire(ctxT(t, 5*time.Second), "restart", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer next.Release(context.Background())
	if next.Fence() <= holder.Fence() {
		t.Errorf("fence after two empty restarts %d, not above the previous holder's %d", next.Fence(), holder.Fence())
	}
}

// Why the rule exists: the holder took a bare majority (two nodes were
// paused), one of its nodes restarts empty at once, and the paused nodes
// come back. Another client then takes the key while the first lease is
// still valid. This documents the limit; it is not a guarantee.
func TestImmediateEmptyRestartOfBareMajorityBreaksExclusion(t *testing.T) {
	c := newCluster(t, 5)
	const nodeTimeout = 100 * time.Millisecond
	a := newStore(t, c.clients(t), redlockstore.WithNodeTimeout(nodeTimeout))
	b := newStore(t, c.clients(t))
	// A first acquisition measures each node's clock, so that a's late
	// requests carry a deadline (on the node's clock) that they miss.
	if warm, err := a.Acquire(ctxT(t, 5*time.Second), "bare-warm", time.Second); err == nil {
		_ = warm.Release(t.Context())
	}
	time.Sleep(100 * time.Millisecond)
	c.procs[3].Pause()
	c.procs[4].Pause()
	holder, err := a.Acquire(ctxT(t, 5*time.Second), "bare", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release(context.Background())
	c.procs[2].Kill()
	c.procs[2].Start()
	time.Sleep(2 * nodeTimeout) // past the deadline of the requests queued on 3 and 4
	c.procs[3].Resume()         // which now refuse them
	c.procs[4].Resume()
	other, err := b.TryAcquire(ctxT(t, 5*time.Second), "bare", time.Second)
	if err != nil {
		t.Fatalf("expected the documented violation, got %v", err)
	}
	other.Release(context.Background())
	select {
	case <-holder.Done():
		t.Fatal("the first lease ended; the test no longer shows an overlap")
	default:
	}
}

// waitAll waits until key exists on every node of c.
func waitAll(t *testing.T, c *cluster, key string) {
	t.Helper()
	for _, a := range c.addrs {
		rc := redis.NewClient(&redis.Options{Addr: a})
		deadline := time.Now().Add(5 * time.Second)
		for rc.Exists(context.Background(), key).Val() != 1 {
			if time.Now().After(deadline) {
				t.Fatalf("%s never held %s", a, key)
			}
			time.Sleep(5 * time.Millisecond)
		}
		rc.Close()
	}
}

// A released hold's fence stays on every node that took it while the
// node's clock has not passed it, so that up to N − quorum of them can
// restart empty right after the release and the next fence is still above
// it. The nodes start with tombstones 800 ms ahead of their clocks, so the
// hold's fence T is ahead of every clock; the release is at once, before
// the nodes that answered after the majority are known to have taken the
// key.
func TestReleasedFenceKeptOnEveryNode(t *testing.T) {
	c := newCluster(t, 5)
	ctx := ctxT(t, time.Minute)
	const name = "oncekit:redlock:{kept-fence}"
	s := newStore(t, c.clients(t))
	testenv.AcquireRelease(ctx, t, s, "warm", time.Second) // scripts loaded, clocks measured
	rcs := make([]*redis.Client, len(c.addrs))
	for i, a := range c.addrs {
		rcs[i] = redis.NewClient(&redis.Options{Addr: a})
		defer rcs[i].Close()
		now, err := rcs[i].Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		rcs[i].Set(ctx, name, fmt.Sprintf("L1|~|%d|", now.Add(800*time.Millisecond).UnixMicro()), time.Minute)
	}
	l, err := s.Acquire(ctx, "kept-fence", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	base := l.Fence() / 128 // the hold's T (128 lease fences per hold)
	for i, rc := range rcs {
		deadline := time.Now().Add(5 * time.Second)
		for {
			v, err := rc.Get(ctx, name).Result()
			var f uint64
			if err == nil && strings.HasPrefix(v, "L1|~|") {
				fmt.Sscanf(v, "L1|~|%d|", &f)
			}
			if f >= base {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("node %d kept %q (%v) after the release, want a tombstone of at least %d", i, v, err, base)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	for _, p := range c.procs[:2] {
		p.Kill()
		p.Start() // empty: no persistence
	}
	c.procs[2].Pause() // the next majority: the two empty nodes and one of the rest
	defer c.procs[2].Resume()
	next, err := newStore(t, c.clients(t)).Acquire(ctx, "kept-fence", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c.procs[2].Resume()
	defer next.Release(context.Background())
	if next.Fence() <= l.Fence() {
		t.Errorf("fence after two empty restarts %d, not above the released hold's %d", next.Fence(), l.Fence())
	}
}

// Fences only grow across successive holders, however the rounds
// interleave: nodes start with very different last fences (tombstones up to
// 400 ms ahead of their clocks); for each acquisition up to two random
// nodes are paused (so the holder takes a bare or partial majority, and
// their requests arrive late or not at all), or restarted empty (losing
// their fences).
func TestFencesGrowAcrossInterleavings(t *testing.T) {
	c := newCluster(t, 5)
	ctx := ctxT(t, 2*time.Minute)
	for i, a := range c.addrs { // uneven starting fences
		rc := redis.NewClient(&redis.Options{Addr: a})
		now, err := rc.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		ahead := time.Duration([]int{50, 3, 400, 7, 200}[i]) * time.Millisecond
		rc.Set(ctx, "oncekit:redlock:{interleave}", fmt.Sprintf("L1|~|%d|", now.Add(ahead).UnixMicro()), time.Minute)
		rc.Close()
	}
	stores := []*redlockstore.Store{newStore(t, c.clients(t)), newStore(t, c.clients(t))}
	rng := rand.New(rand.NewPCG(1, 2))
	var last uint64
	for round := range 40 {
		var paused []*testenv.RedisProcess
		switch fault := rng.IntN(3); fault {
		case 0: // pause one or two nodes during this acquisition
			for _, i := range rng.Perm(5)[:1+rng.IntN(2)] {
				c.procs[i].Pause()
				paused = append(paused, c.procs[i])
			}
		case 1: // restart one or two nodes empty
			for _, i := range rng.Perm(5)[:1+rng.IntN(2)] {
				c.procs[i].Kill()
				c.procs[i].Start()
			}
		}
		s := stores[round%2]
		l, err := s.Acquire(ctx, "interleave", 2*time.Second)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if l.Fence() <= last {
			t.Fatalf("round %d: fence %d not above the previous holder's %d", round, l.Fence(), last)
		}
		last = l.Fence()
		for _, p := range paused {
			p.Resume()
		}
		if err := l.Release(ctx); err != nil {
			t.Fatalf("round %d: Release: %v", round, err)
		}
	}
}

func TestNewValidates(t *testing.T) {
	c := func() redlockstore.Client {
		rc := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", 1+rand.IntN(1000))})
		t.Cleanup(func() { rc.Close() })
		return rc
	}
	for _, tc := range []struct {
		name    string
		clients []redlockstore.Client
		opts    []redlockstore.Option
	}{
		{"no nodes", nil, nil},
		{"one node", []redlockstore.Client{c()}, nil},
		{"even", []redlockstore.Client{c(), c(), c(), c()}, nil},
		{"nil client", []redlockstore.Client{c(), nil, c()}, nil},
		{"brace in prefix", []redlockstore.Client{c(), c(), c()}, []redlockstore.Option{redlockstore.WithPrefix("{x}")}},
		{"drift", []redlockstore.Client{c(), c(), c()}, []redlockstore.Option{redlockstore.WithDrift(0.6, 0)}},
	} {
		if _, err := redlockstore.New(tc.clients, tc.opts...); err == nil {
			t.Errorf("New with %s: no error", tc.name)
		}
	}
	same := redis.NewClient(&redis.Options{Addr: "127.0.0.1:9"})
	defer same.Close()
	if _, err := redlockstore.New([]redlockstore.Client{same, same, c()}); err == nil {
		t.Error("New with one server twice: no error")
	}
}

// A claim's fence reaches every node when the claim ends: without that, a
// claim taken on a majority that included a node whose fence ran ahead
// (claim X: the highest fence of its majority) could be followed, once
// that node is gone, by a claim of the same key from the other nodes with
// a lower fence (claim Y).
func TestClaimFencesNeverGoBackwards(t *testing.T) {
	c := newCluster(t, 5)
	ctx := ctxT(t, time.Minute)
	key := "claim-fence"
	rc := redis.NewClient(&redis.Options{Addr: c.addrs[0]})
	now, err := rc.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	// Node 0 kept a fence 2 s ahead of its clock (within TTL/2 of 10 s).
	high := now.Add(2 * time.Second).UnixMicro()
	if err := rc.Set(ctx, "oncekit:redlock-idem:{"+key+"}", fmt.Sprintf("R2|x|%d|||0|", high), time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	rc.Close()
	s := newStore(t, c.clients(t))
	c.procs[3].Pause() // X's majority is nodes 0, 1 and 2
	c.procs[4].Pause()
	x, err := s.Begin(ctx, idemdriver.MustKey(key), "fp", 10*time.Second)
	if err != nil || x.State != idemdriver.Acquired {
		t.Fatalf("claim X: %v %v", x.State, err)
	}
	if x.Fence <= uint64(high) {
		t.Fatalf("claim X's fence %d, want above node 0's %d", x.Fence, high)
	}
	if err := s.Abandon(ctx, x); err != nil {
		t.Fatal(err)
	}
	c.procs[3].Resume()
	c.procs[4].Resume()
	c.procs[0].Kill() // the node whose fence ran ahead is gone
	// X's requests to the paused nodes ran when they resumed; the Store
	// gives those late claims back (or their lease ends).
	var y idemdriver.Claim
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		// (With node 0 gone and X's late claims still on nodes 3 and 4, a
		// round can also end without a majority either way.)
		y, err = s.Begin(ctx, idemdriver.MustKey(key), "fp", 10*time.Second)
		waiting := y.State == idemdriver.InFlight || errors.Is(err, redlockstore.ErrNoQuorum)
		if !waiting || time.Now().After(deadline) {
			break
		}
	}
	if err != nil || y.State != idemdriver.Acquired {
		t.Fatalf("claim Y: %v %v", y.State, err)
	}
	if y.Fence <= x.Fence {
		t.Fatalf("claim Y's fence %d is not above claim X's %d", y.Fence, x.Fence)
	}
	c.procs[0].Start()
}

// Close wakes a duplicate waiting for an in-flight claim (WaitChange)
// instead of waiting with it for the claim's lease.
func TestCloseWakesWaitChange(t *testing.T) {
	c := newCluster(t, 3)
	ctx := ctxT(t, 20*time.Second)
	holder := newStore(t, c.clients(t))
	claim, err := holder.Begin(ctx, idemdriver.MustKey("waited"), "fp", 30*time.Second)
	if err != nil || claim.State != idemdriver.Acquired {
		t.Fatalf("Begin: %v %v", claim.State, err)
	}
	s, err := redlockstore.New(c.clients(t))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.WaitChange(ctx, idemdriver.MustKey("waited"), time.Now().Add(30*time.Second)) }()
	time.Sleep(200 * time.Millisecond)
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	select {
	case err := <-done:
		if !errors.Is(err, lock.ErrClosed) {
			t.Errorf("WaitChange after Close: %v, want ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("WaitChange still waits 5 s after Close")
	}
	<-closed
}

// With 3 of 5 nodes gone: Acquire gives up after WithQuorumWait (not only
// at the caller's deadline) with each node's real failure, and Begin on a
// key whose claim the two live nodes hold says the quorum is missing
// rather than "in flight".
func TestQuorumLostReportsNodes(t *testing.T) {
	c := newCluster(t, 5)
	s := newStore(t, c.clients(t), redlockstore.WithQuorumWait(time.Second))
	ctx := ctxT(t, 30*time.Second)
	claim, err := s.Begin(ctx, idemdriver.MustKey("begun"), "fp", 30*time.Second)
	if err != nil || claim.State != idemdriver.Acquired {
		t.Fatalf("Begin: %v %v", claim.State, err)
	}
	for _, p := range c.procs[2:] {
		p.Kill()
	}
	start := time.Now()
	_, err = s.Acquire(ctx, "quorum-lost", time.Second)
	if !errors.Is(err, redlockstore.ErrNoQuorum) || !errors.Is(err, lock.ErrNotAcquired) || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire without a quorum: %v; want ErrNoQuorum and ErrNotAcquired before the deadline", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("Acquire gave up after %s, with a 1 s quorum wait", d)
	}
	// Each killed node's real failure (a refused connection, or the reset
	// of a pooled one), not only "no answer within the node timeout".
	if msg := err.Error(); !strings.Contains(msg, "connection refused") && !strings.Contains(msg, "EOF") &&
		!strings.Contains(msg, "reset by peer") {
		t.Errorf("the error does not say what the nodes did: %v", err)
	}
	_, err = s.Begin(ctx, idemdriver.MustKey("begun"), "fp", time.Second)
	if !errors.Is(err, redlockstore.ErrNoQuorum) {
		t.Errorf("Begin with 2 of 5 nodes answering: %v, want ErrNoQuorum (not in flight)", err)
	}
	// Bring the nodes back: go-redis keeps redialling a dead address in the
	// background until a dial succeeds.
	for _, p := range c.procs[2:] {
		p.Start()
	}
	if l, err := s.Acquire(ctx, "quorum-back", time.Second); err != nil {
		t.Errorf("Acquire after the nodes came back: %v", err)
	} else {
		_ = l.Release(ctx)
	}
}

// Two paused nodes of five must not cost contended locking their node
// timeout on every round once the live majority has answered: clean-up
// rounds (leaving the waiting queues, giving nodes back) stop waiting at
// a majority. With a 3 s node timeout, 12 contended acquisitions that each
// waited for the paused nodes would take over 30 s.
func TestPausedNodesDoNotStallContention(t *testing.T) {
	c := newCluster(t, 5)
	stores := []*redlockstore.Store{
		newStore(t, c.clients(t), redlockstore.WithNodeTimeout(3*time.Second)),
		newStore(t, c.clients(t), redlockstore.WithNodeTimeout(3*time.Second)),
	}
	ctx := ctxT(t, time.Minute)
	if l, err := stores[0].Acquire(ctx, "paused-contention", 5*time.Second); err == nil { // load the scripts
		_ = l.Release(ctx)
	}
	c.procs[3].Pause()
	c.procs[4].Pause()
	defer c.procs[3].Resume()
	defer c.procs[4].Resume()
	start := time.Now()
	var wg sync.WaitGroup
	for _, s := range stores {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 6 {
				l, err := s.Acquire(ctx, "paused-contention", 5*time.Second)
				if err != nil {
					t.Errorf("Acquire with 2 of 5 nodes paused: %v", err)
					return
				}
				time.Sleep(5 * time.Millisecond)
				if err := l.Release(ctx); err != nil {
					t.Errorf("Release: %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if d := time.Since(start); d > 15*time.Second {
		t.Errorf("12 contended acquisitions with 2 nodes paused took %s: rounds wait for the paused nodes", d)
	}
}

// As for redisstore: a client clock ±5 s off from the nodes' does not
// break acquisition; each node's offset is measured and deadlines are sent
// on its clock.
func TestClientClockSkew(t *testing.T) {
	addrs := testenv.RedisAddrs(t, 5)[:5]
	for _, skew := range []time.Duration{-5 * time.Second, 5 * time.Second} {
		t.Run(skew.String(), func(t *testing.T) {
			s := newStore(t, clients(t, addrs))
			redlockstore.SetClockSkew(s, skew)
			key := fmt.Sprintf("skew%s-%d", skew, time.Now().UnixNano())
			if warm, err := s.TryAcquire(ctxT(t, 2*time.Second), key+"-warm", time.Second); err == nil {
				_ = warm.Release(t.Context())
			}
			time.Sleep(100 * time.Millisecond)
			for i := range 3 {
				l, err := s.Acquire(ctxT(t, 2*time.Second), key, time.Second)
				if err != nil {
					t.Fatalf("Acquire #%d with the client's clock %s off: %v", i, skew, err)
				}
				if err := l.Release(t.Context()); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// queueNodesByAddr is queueNodes for nodes listed in any order: the Store
// ranks them by address.
func queueNodesByAddr(key string, addrs []string) []int {
	sorted := slices.Clone(addrs)
	slices.Sort(sorted)
	var idx []int
	for r := range queueNodes(key, len(addrs)) {
		idx = append(idx, slices.Index(addrs, sorted[r]))
	}
	return idx
}

// Two of a key's three queue nodes down (paused or stopped): waiters that
// expect the key held ask the queue nodes only, and must still get it —
// when the holder releases (woken by the one queue node left) and when it
// never does (its lease runs out, and a round to the queue nodes cannot
// make a majority).
func TestQueueNodesDown(t *testing.T) {
	for _, fault := range []string{"paused", "stopped"} {
		t.Run(fault, func(t *testing.T) {
			c := newCluster(t, 5)
			ls := lockers(t, c, 3)
			key := "queue-down-" + fault
			contend(t, ls, key, 3, 5)
			for _, i := range queueNodesByAddr(key, c.addrs)[1:] {
				if fault == "paused" {
					c.procs[i].Pause()
					defer c.procs[i].Resume()
				} else {
					c.procs[i].Kill()
				}
			}
			contend(t, ls, key, 4, 10)

			ctx := ctxT(t, time.Minute)
			held, err := ls[0].Acquire(ctx, key, time.Second)
			if err != nil {
				t.Fatal(err)
			}
			_ = held // never released: its lease runs out
			start := time.Now()
			l, err := ls[1].Acquire(ctx, key, time.Second)
			if err != nil {
				t.Fatalf("waiting out a lease with two queue nodes down: %v", err)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("the waiter got the key %s after a 1 s lease", d.Round(time.Millisecond))
			}
			if l.Fence() <= held.Fence() {
				t.Errorf("fence %d after the expired holder's %d", l.Fence(), held.Fence())
			}
			_ = l.Release(ctx)
		})
	}
}

// Ping is a readiness probe, not a lock request: a majority that answers
// within a second is healthy even where a lock's node timeout (a tenth of
// a 1 s TTL) would have given up, through clients that cut requests at
// their context's deadline as storage.Open's do; and a majority that does
// not answer is a *QuorumError within that second, not after the clients'
// own read timeouts (3 s).
func TestPingWaitsForSlowNodes(t *testing.T) {
	c := newCluster(t, 3)
	cs := make([]redlockstore.Client, len(c.addrs))
	for i, a := range c.addrs {
		rc := redis.NewClient(&redis.Options{Addr: a, ContextTimeoutEnabled: true})
		t.Cleanup(func() { rc.Close() })
		cs[i] = rc
	}
	s := newStore(t, cs)
	ctx := ctxT(t, 20*time.Second)
	if err := s.Ping(ctx); err != nil { // connected
		t.Fatal(err)
	}
	c.procs[1].Pause()
	c.procs[2].Pause()
	resumed := time.AfterFunc(300*time.Millisecond, func() { c.procs[1].Resume() })
	defer resumed.Stop()
	defer c.procs[1].Resume()
	defer c.procs[2].Resume()
	if err := s.Ping(ctx); err != nil {
		t.Errorf("Ping with a node answering after 300 ms: %v, want healthy", err)
	}
	c.procs[1].Pause()
	start := time.Now()
	var qe *redlockstore.QuorumError
	if err := s.Ping(ctx); !errors.As(err, &qe) {
		t.Errorf("Ping with 2 of 3 nodes paused: %v, want a *QuorumError", err)
	}
	if d := time.Since(start); d > 2500*time.Millisecond {
		t.Errorf("Ping with 2 of 3 nodes paused answered after %v, not within its second", d)
	}
}
