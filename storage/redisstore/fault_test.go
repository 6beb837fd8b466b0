package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/storage/internal/rediskit"
	"github.com/oncekit/oncekit/storage/redisstore"
)

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// privateClient has go-redis' default timeouts (3 s reads, no
// ContextTimeoutEnabled): the Store must honour callers' contexts itself.
func privateClient(t *testing.T, p *testenv.RedisProcess) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: p.Addr, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	return c
}

// A stopped server: calls fail with a clear error (not ErrNotAcquired, which
// would claim the key is held), the held lease reports its loss when its TTL
// runs out, and service resumes when the server is back.
func TestServerStopped(t *testing.T) {
	p := testenv.StartRedis(t)
	s := newStore(t, privateClient(t, p))
	const ttl = 2 * time.Second
	lease, err := s.Acquire(ctxT(t, 5*time.Second), "stopped", ttl)
	if err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	p.Kill()
	if err := lease.Refresh(ctxT(t, 5*time.Second), ttl); err == nil || errors.Is(err, lock.ErrLockLost) {
		t.Errorf("Refresh with the server down: %v, want a network error (the lease may still be valid)", err)
	}

	_, err = s.TryAcquire(ctxT(t, 5*time.Second), "other", time.Second)
	if err == nil || errors.Is(err, lock.ErrNotAcquired) || !strings.Contains(err.Error(), "redisstore: acquire") {
		t.Errorf("TryAcquire with the server down: %v, want a redisstore error that is not ErrNotAcquired", err)
	}
	if _, err := s.Acquire(ctxT(t, 5*time.Second), "other", time.Second); err == nil {
		t.Error("Acquire with the server down succeeded")
	}
	select {
	case <-lease.Done():
	case <-time.After(time.Until(killed.Add(ttl + time.Second))):
		t.Fatal("Done still open 1s after the TTL of a lease that cannot be refreshed")
	}

	p.Start()
	l2, err := s.Acquire(ctxT(t, 5*time.Second), "stopped", 10*time.Second)
	if err != nil {
		t.Fatalf("Acquire after restart: %v", err)
	}
	if err := l2.Release(ctxT(t, 5*time.Second)); err != nil {
		t.Fatalf("Release after restart: %v", err)
	}
}

// A paused server (SIGSTOP) answers nothing: Acquire ends at its deadline
// with both sentinels, and once the server resumes the attempt has left
// nothing behind.
func TestServerPaused(t *testing.T) {
	p := testenv.StartRedis(t)
	c := privateClient(t, p)
	s := newStore(t, c)
	if _, err := s.TryAcquire(ctxT(t, 5*time.Second), "warm", lock.MinTTL); err != nil {
		t.Fatal(err)
	}
	p.Pause()
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	_, err := s.Acquire(ctx, "paused", 30*time.Second)
	cancel()
	if err == nil {
		t.Fatal("Acquire against a paused server succeeded")
	}
	if !errors.Is(err, lock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Acquire against a paused server: %v, want ErrNotAcquired and DeadlineExceeded", err)
	}
	p.Resume()
	// The acquire script may have run when the server resumed; the clean-up
	// that Acquire queued behind it must have deleted it again.
	deadline := time.Now().Add(5 * time.Second)
	for {
		tok, _ := lockValue(t, c, "oncekit:lock:{paused}")
		if tok == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a cancelled Acquire left its key behind (held by %q)", tok)
		}
		time.Sleep(20 * time.Millisecond)
	}
	lease, err := s.TryAcquire(ctxT(t, 5*time.Second), "paused", 10*time.Second)
	if err != nil {
		t.Fatalf("TryAcquire after resume: %v", err)
	}
	_ = lease.Release(ctxT(t, 5*time.Second))
}

// A killed pub/sub connection: go-redis reconnects and resubscribes, and a
// waiter still gets the key promptly after the holder releases.
func TestPubSubConnectionKilled(t *testing.T) {
	admin := newClient(t)
	holderS, waiterS := newStore(t, newClient(t)), newStore(t, newClient(t))
	key := "pubsub-killed-" + time.Now().Format("150405.000000")
	holder, err := holderS.Acquire(ctxT(t, 5*time.Second), key, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		l, err := waiterS.Acquire(ctxT(t, 10*time.Second), key, 10*time.Second)
		if err == nil {
			err = l.Release(context.Background())
		}
		got <- err
	}()
	time.Sleep(200 * time.Millisecond) // the waiter is subscribed and waiting
	if err := admin.ClientKillByFilter(ctxT(t, time.Second), "TYPE", "pubsub").Err(); err != nil {
		t.Fatalf("CLIENT KILL TYPE pubsub: %v", err)
	}
	time.Sleep(100 * time.Millisecond)
	if err := holder.Release(ctxT(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("waiter after its pub/sub connection was killed: %v", err)
	}
}

// Another client deleting and retaking the key: the old holder learns of it
// from Refresh and its Done closes.
func TestLostToAnother(t *testing.T) {
	admin := newClient(t)
	a, b := newStore(t, newClient(t)), newStore(t, newClient(t))
	key := "lost-" + time.Now().Format("150405.000000")
	old, err := a.Acquire(ctxT(t, 5*time.Second), key, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	admin.Del(ctxT(t, time.Second), "oncekit:lock:{"+key+"}")
	cur, err := b.TryAcquire(ctxT(t, 5*time.Second), key, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := old.Refresh(ctxT(t, 5*time.Second), time.Second); !errors.Is(err, lock.ErrLockLost) {
		t.Errorf("Refresh: %v, want ErrLockLost", err)
	}
	select {
	case <-old.Done():
	default:
		t.Error("Done open after Refresh found another holder")
	}
	if err := cur.Release(ctxT(t, 5*time.Second)); err != nil {
		t.Errorf("new holder's Release: %v", err)
	}
}

func TestCloseWakesWaiters(t *testing.T) {
	holderS, waiterS := newStore(t, newClient(t)), newStore(t, newClient(t))
	key := "close-" + time.Now().Format("150405.000000")
	holder, err := holderS.Acquire(ctxT(t, 5*time.Second), key, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release(context.Background())
	got := make(chan error, 1)
	go func() {
		_, err := waiterS.Acquire(ctxT(t, 10*time.Second), key, time.Second)
		got <- err
	}()
	time.Sleep(200 * time.Millisecond)
	if err := waiterS.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-got; !errors.Is(err, lock.ErrClosed) {
		t.Errorf("waiter after Close: %v, want ErrClosed", err)
	}
	if _, err := waiterS.Acquire(ctxT(t, time.Second), key, time.Second); !errors.Is(err, lock.ErrClosed) {
		t.Errorf("Acquire after Close: %v, want ErrClosed", err)
	}
}

// Uncontended operations are one round trip each; keys share a hash tag.
func TestRoundTripsAndKeys(t *testing.T) {
	var rt counter
	c := newClient(t, &rt)
	s := newStore(t, c)
	ctx := ctxT(t, 5*time.Second)
	key := "a}b{c-" + time.Now().Format("150405.000000") // braces in the user's key
	warm, err := s.TryAcquire(ctx, key+"warm", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_ = warm.Release(ctx)

	steps := []struct {
		name string
		do   func(l *lock.Lease) error
	}{
		{"Acquire", func(l *lock.Lease) (err error) { *l, err = s.Acquire(ctx, key, 10*time.Second); return }},
		{"Refresh", func(l *lock.Lease) error { return (*l).Refresh(ctx, 10*time.Second) }},
		{"Release", func(l *lock.Lease) error { return (*l).Release(ctx) }},
	}
	// The braces are escaped in the hash tag, so that every name of the
	// lock shares one Cluster slot.
	name := "oncekit:lock:{" + strings.NewReplacer("{", "%7B", "}", "%7D").Replace(key) + "}"
	var l lock.Lease
	for _, st := range steps {
		before := rt.N.Load()
		if err := st.do(&l); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if n := rt.N.Load() - before; n != 1 {
			t.Errorf("%s made %d round trips, want 1", st.name, n)
		}
		if st.name == "Refresh" {
			// The key keeps the last of the fences Redis issued for the
			// hold; the hold's first lease takes the first.
			tok, fence := lockValue(t, c, name)
			if tok != l.Token() || fence != l.Fence()+rediskit.HoldFences-1 {
				t.Errorf("the key holds %s with fence %d, want %s with %d", tok, fence, l.Token(), l.Fence()+rediskit.HoldFences-1)
			}
		}
	}
	// Released: nothing is left of it once the clock has passed the hold's
	// last fence (a tombstone keeps it until then, at most 2 ms).
	time.Sleep(5 * time.Millisecond)
	if n := c.Exists(ctx, name, name+":owner", name+":q", name+":qx").Val(); n != 0 {
		t.Errorf("%d names of the released key left in Redis, want none", n)
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	for name, opt := range map[string]redisstore.Option{
		"brace in prefix": redisstore.WithPrefix("app{x}:"),
		"pub/sub mode":    redisstore.WithPubSub(redisstore.PubSubMode(9)),
		"recheck":         redisstore.WithRecheckInterval(0),
		"backoff":         redisstore.WithBackoff(time.Second, time.Millisecond),
	} {
		if _, err := redisstore.New(c, opt); err == nil {
			t.Errorf("New with a bad %s: no error", name)
		}
	}
	if _, err := redisstore.New(nil); err == nil {
		t.Error("New(nil): no error")
	}
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1", "b": "127.0.0.1:2"}})
	defer ring.Close()
	if _, err := redisstore.New(ring); err == nil || !strings.Contains(err.Error(), "Ring") {
		t.Errorf("New(*redis.Ring): %v; want a clear refusal", err)
	}
}

// Outside Cluster, AcquireAll takes every key in one script: one round trip.
func TestAcquireAllOneRoundTrip(t *testing.T) {
	var rt counter
	s := newStore(t, newClient(t, &rt))
	ctx := ctxT(t, 5*time.Second)
	base := "multi-" + time.Now().Format("150405.000000")
	warm, err := lock.AcquireAll(ctx, s, []string{base + "warm"}, time.Second) // loads the script
	if err != nil {
		t.Fatal(err)
	}
	_ = warm.Release(ctx)
	before := rt.N.Load()
	m, err := lock.AcquireAll(ctx, s, []string{base + "/c", base + "/a", base + "/b", base + "/a"}, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if n := rt.N.Load() - before; n != 1 {
		t.Errorf("AcquireAll of 3 keys made %d round trips, want 1", n)
	}
	if got := m.Keys(); len(got) != 3 || got[0] != base+"/a" || got[2] != base+"/c" {
		t.Errorf("Keys() = %q", got)
	}
	other := newStore(t, newClient(t))
	for _, k := range m.Keys() {
		if _, err := other.TryAcquire(ctx, k, time.Second); !errors.Is(err, lock.ErrNotAcquired) {
			t.Errorf("TryAcquire(%q) while AcquireAll holds it: %v", k, err)
		}
	}
	if err := m.Release(ctx); err != nil {
		t.Fatal(err)
	}
	m2, err := lock.AcquireAll(ctx, other, m.Keys(), 10*time.Second)
	if err != nil {
		t.Fatalf("AcquireAll after Release: %v", err)
	}
	for _, k := range m.Keys() {
		if m2.Fence(k) <= m.Fence(k) {
			t.Errorf("fence of %q did not grow: %d then %d", k, m.Fence(k), m2.Fence(k))
		}
	}
	_ = m2.Release(ctx)
}

// Fences never go backwards, not even when the server restarts without its
// data (or fails over to a replica that lacked the counters): lock and
// claim fences after each empty restart are above every earlier one.
func TestFencesSurviveEmptyRestart(t *testing.T) {
	p := testenv.StartRedis(t)
	s := newStore(t, privateClient(t, p))
	ctx := ctxT(t, 30*time.Second)
	var locks, claims []uint64
	for round := range 3 {
		for range 3 {
			l, err := s.Acquire(ctx, "fenced", time.Minute)
			if err != nil {
				t.Fatalf("round %d: Acquire: %v", round, err)
			}
			locks = append(locks, l.Fence())
			if err := l.Release(ctx); err != nil {
				t.Fatalf("round %d: Release: %v", round, err)
			}
			c, err := s.Begin(ctx, idemdriver.MustKey("claimed"), "fp", time.Minute)
			if err != nil || c.State != idemdriver.Acquired {
				t.Fatalf("round %d: Begin: %v %v", round, c.State, err)
			}
			claims = append(claims, c.Fence)
			if err := s.Abandon(ctx, c); err != nil {
				t.Fatalf("round %d: Abandon: %v", round, err)
			}
		}
		if round < 2 {
			p.Kill()
			p.Start()
		}
	}
	for _, fences := range [][]uint64{locks, claims} {
		for i := 1; i < len(fences); i++ {
			if fences[i] <= fences[i-1] {
				t.Fatalf("fences %v went backwards at %d, across an empty restart", fences, i)
			}
		}
	}
}

// Every key oncekit writes expires: lock keys and their tombstones, owner
// hashes, waiting queues, idempotency records.
func TestEveryKeyExpires(t *testing.T) {
	p := testenv.StartRedis(t)
	c := privateClient(t, p)
	s := newStore(t, c)
	ctx := ctxT(t, 10*time.Second)
	l, err := s.Acquire(lock.WithOwner(ctx, "worker-1"), "k", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	blocked := make(chan error, 1)
	go func() { // a waiter from another Store joins the key's queue
		l2, err := newStore(t, c).Acquire(ctx, "k", time.Minute)
		if err == nil {
			err = l2.Release(ctx)
		}
		blocked <- err
	}()
	time.Sleep(100 * time.Millisecond)
	g, err := idem.NewGuard(s)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := g.Do(ctx, "request-1", "fp", func(context.Context) ([]byte, error) { return []byte("ok"), nil }); err != nil {
		t.Fatal(err)
	}
	keys, err := c.Keys(ctx, "*").Result()
	if err != nil || len(keys) < 5 {
		t.Fatalf("keys %v (%v): want the lock's and the record's", keys, err)
	}
	for _, k := range keys {
		if ttl, err := c.PTTL(ctx, k).Result(); err != nil || ttl < 0 {
			t.Errorf("%s: PTTL %s (%v); every key must expire", k, ttl, err)
		}
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-blocked; err != nil {
		t.Fatal(err)
	}
}

// A Begin whose caller gave up while the server was paused leaves no
// claim behind: when the server answers late, the claim nobody will use is
// given back at once instead of blocking the key for its lease.
func TestCancelledBeginLeavesNoClaim(t *testing.T) {
	p := testenv.StartRedis(t)
	s := newStore(t, privateClient(t, p))
	ctx := ctxT(t, 20*time.Second)
	if _, err := s.Begin(ctx, idemdriver.MustKey("warm"), "fp", time.Second); err != nil { // loads the scripts
		t.Fatal(err)
	}
	p.Pause()
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err := s.Begin(short, idemdriver.MustKey("paused"), "fp", 30*time.Second)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Begin on a paused server: %v, want the deadline", err)
	}
	p.Resume()
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := s.Begin(ctx, idemdriver.MustKey("paused"), "fp", time.Second)
		if err == nil && c.State == idemdriver.Acquired {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Begin after the server resumed: %v %v; the abandoned claim still blocks the key", c.State, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A request whose claim outlives it (idemdriver.ClaimOutlivesCaller, as httpmw
// and grpcmw make theirs) and whose client hangs up while the server is
// paused: on a client that enforces deadlines the claim is made on the
// caller's goroutine and waits for the server rather than leave; once the
// server answers, the claim is given back before Do returns the caller's
// error, and the key is free at once.
func TestClaimOutlivingItsCallerOnPausedServer(t *testing.T) {
	p := testenv.StartRedis(t)
	c := redis.NewClient(&redis.Options{Addr: p.Addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	s := newStore(t, c)
	g, err := idem.NewGuard(s)
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 20*time.Second)
	if _, err := s.Begin(ctx, idemdriver.MustKey("warm"), "fp", time.Second); err != nil { // loads the scripts
		t.Fatal(err)
	}
	p.Pause()
	req, hangUp := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, _, err := g.Do(idemdriver.ClaimOutlivesCaller(req), "paused", "fp", func(context.Context) ([]byte, error) {
			t.Error("ran for a request that had left")
			return nil, nil
		})
		done <- err
	}()
	time.Sleep(100 * time.Millisecond)
	hangUp()
	select {
	case err := <-done:
		t.Fatalf("Do returned while its claim was still on the way to the paused server: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	p.Resume()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Do = %v, want the caller's context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Do did not return once the server answered")
	}
	got, err := s.Begin(ctx, idemdriver.MustKey("paused"), "fp", time.Second)
	if err != nil || got.State != idemdriver.Acquired {
		t.Fatalf("after the request left: Begin = %v, %v; want the key given back", got.State, err)
	}
}

// A client whose clock is off from the server's by ±5 s still acquires:
// deadlines reach the scripts on the server's clock (an offset measured
// with TIME), never as the client wrote them.
func TestClientClockSkew(t *testing.T) {
	for _, skew := range []time.Duration{-5 * time.Second, 5 * time.Second} {
		t.Run(skew.String(), func(t *testing.T) {
			s := newStore(t, newClient(t))
			redisstore.SetClockSkew(s, skew) // the client's clock runs skew ahead of the server's
			key := fmt.Sprintf("skew%s-%d", skew, time.Now().UnixNano())
			warm, err := s.TryAcquire(ctxT(t, 2*time.Second), key+"-warm", time.Second) // first use: the offset is measured
			if err != nil {
				t.Fatal(err)
			}
			_ = warm.Release(t.Context())
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

// AcquireAll waits its turn in the queue of the key in its way: while
// single-key waiters of other processes keep that key busy, a release
// wakes it in its turn, so it is not starved until the contention ends
// (it listened only on the general channel, which a release uses when
// nobody is queued).
func TestAcquireAllNotStarvedBySingleKeyWaiters(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	run := time.Now().Format("150405.000000")
	hot, other := "starve-hot-"+run, "starve-other-"+run
	var stop atomic.Bool
	var wg sync.WaitGroup
	for range 3 { // three processes taking the hot key in turn
		s := newStore(t, newClient(t))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				l, err := s.Acquire(ctx, hot, 5*time.Second)
				if err != nil {
					return
				}
				time.Sleep(2 * time.Millisecond)
				_ = l.Release(ctx)
			}
		}()
	}
	time.Sleep(200 * time.Millisecond) // the hot key is busy and its queue full
	start := time.Now()
	got, err := newStore(t, newClient(t)).AcquireAll(ctx, []string{hot, other}, 5*time.Second)
	took := time.Since(start)
	stop.Store(true)
	for _, l := range got {
		_ = l.Release(ctx)
	}
	wg.Wait()
	if err != nil {
		t.Fatalf("AcquireAll: %v", err)
	}
	if took > 2*time.Second {
		t.Errorf("AcquireAll waited %s behind single-key waiters that hand the key over every few ms", took.Round(time.Millisecond))
	}
}

// Release with a live context that has no deadline is bounded like the
// cancelled case: a paused server does not block it for good.
func TestReleaseBoundedWithoutDeadline(t *testing.T) {
	p := testenv.StartRedis(t)
	s := newStore(t, privateClient(t, p))
	l, err := s.Acquire(ctxT(t, 5*time.Second), "bounded-release", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	p.Pause()
	defer p.Resume()
	start := time.Now()
	err = l.Release(context.Background())
	if err == nil {
		t.Fatal("Release on a paused server succeeded")
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("Release(context.Background()) on a paused server returned after %s", d)
	}
}

// A run whose Store loses its connection mid-run (held by a partition, not
// closed) ends before another process can claim its key: the Guard's own
// timer ends it at the claim's validity, whatever its hanging extension.
func TestRunEndsWhenConnectionCut(t *testing.T) {
	p := testenv.StartProxy(t, testenv.RedisAddrs(t, 1)[0])
	cut := redis.NewClient(&redis.Options{Addr: p.Addr, ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { _ = cut.Close() })
	testenv.CheckRunEndsWhenCut(t, newStore(t, cut), newStore(t, newClient(t)), p)
}

// slowReply holds back the reply of every script call by delay, plus up
// to jitter, while on: the lease a reply grants ends about when its
// caller sees it.
type slowReply struct {
	on            atomic.Bool
	delay, jitter time.Duration
}

func (h *slowReply) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *slowReply) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if n := cmd.Name(); h.on.Load() && (n == "evalsha" || n == "eval") {
			time.Sleep(h.delay + rand.N(h.jitter+1))
		}
		return err
	}
}
func (h *slowReply) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A lease whose deadline passes before its Store records it as the key's
// holder (2 ms TTL, replies 1.5–2.5 ms late) must not stay recorded once the key
// expired in Redis: otherwise every later TryAcquire of the key in this
// process is busy and every Acquire waits for ever.
func TestExpiredLeaseNotLeftAsHolder(t *testing.T) {
	for name, opts := range map[string][]redisstore.Option{
		"default":      nil,
		"no hand-offs": {redisstore.WithMaxLocalHandOffs(0)},
	} {
		t.Run(name, func(t *testing.T) { testExpiredLeaseNotLeftAsHolder(t, opts) })
	}
}

func testExpiredLeaseNotLeftAsHolder(t *testing.T, opts []redisstore.Option) {
	slow := &slowReply{delay: 1500 * time.Microsecond, jitter: time.Millisecond}
	s := newStore(t, newClient(t, slow), opts...)
	m, err := lock.NewMutex(s, lock.WithTTL(2*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 20*time.Second)
	key := "stale-holder-" + time.Now().Format("150405.000000")
	slow.on.Store(true)
	for range 200 {
		_ = m.Do(ctx, key, func(context.Context, lock.Lease) error { return nil })
		if l, err := s.TryAcquire(ctx, key, 2*time.Millisecond); err == nil {
			_ = l.Release(ctx)
		}
	}
	slow.on.Store(false)
	time.Sleep(10 * time.Millisecond) // every hold of the loop has expired in Redis
	l, err := s.TryAcquire(ctx, key, time.Second)
	if err != nil {
		t.Fatalf("TryAcquire of a key free in Redis: %v (a stale local holder)", err)
	}
	_ = l.Release(ctx)
	actx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	l, err = s.Acquire(actx, key, time.Second)
	if err != nil {
		t.Fatalf("Acquire of a key free in Redis: %v (a stale local holder)", err)
	}
	_ = l.Release(ctx)
}
