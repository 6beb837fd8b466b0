package redisstore_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/storage/internal/rediskit"
	"github.com/oncekit/oncekit/storage/redisstore"
)

// holdsToken reports the token key holds in Redis, "" when it is free.
func holdsToken(t *testing.T, c *redis.Client, key string) string {
	t.Helper()
	tok, _ := lockValue(t, c, "oncekit:lock:{"+key+"}")
	return tok
}

// lockValue reads the lock key name as rediskit's lua/fence.lua writes
// it: the holder's token ("" when free: absent, or a released key's
// tombstone) and the key's last fence.
func lockValue(t *testing.T, c *redis.Client, name string) (tok string, fence uint64) {
	t.Helper()
	v, err := c.Get(context.Background(), name).Result()
	if err == redis.Nil {
		return "", 0
	}
	if err != nil {
		t.Fatal(err)
	}
	parts := strings.Split(strings.TrimPrefix(v, "L1|"), "|")
	if len(parts) != 3 || !strings.HasPrefix(v, "L1|") {
		t.Fatalf("lock key %s holds %q", name, v)
	}
	if fence, err = strconv.ParseUint(parts[1], 10, 64); err != nil {
		t.Fatalf("lock key %s holds %q", name, v)
	}
	if parts[0] == "~" {
		return "", fence
	}
	return parts[0], fence
}

// flagWaiters marks the held lock key name as having queued waiters, as
// an acquisition that joins its queue does.
func flagWaiters(t *testing.T, c *redis.Client, name string) {
	t.Helper()
	v, err := c.Get(context.Background(), name).Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SetArgs(context.Background(), name, v+"w", redis.SetArgs{KeepTTL: true}).Err(); err != nil {
		t.Fatal(err)
	}
}

// A Store that takes a key again right after letting it go keeps its next
// Release's hold: its next Acquire takes the key with no request, the same
// hold and a higher fence, up to WithMaxLocalHandOffs times. Then the key
// is let go, and the process waiting for it gets it with a fence above
// all of them.
func TestHotKeyKeptForNextAcquire(t *testing.T) {
	admin := newClient(t)
	var rt counter
	a := newStore(t, newClient(t, &rt), redisstore.WithLinger(time.Hour), redisstore.WithMaxLocalHold(0), redisstore.WithMaxLocalHandOffs(4))
	b := newStore(t, newClient(t))
	ctx := ctxT(t, 20*time.Second)
	key := "kept-" + time.Now().Format("150405.000000")

	first := testenv.AcquireRelease(ctx, t, a, key, 10*time.Second)
	if tok := holdsToken(t, admin, key); tok != "" {
		t.Fatalf("a cold key's Release left it held by %q", tok)
	}
	// Taken again at once: hot, kept for the Store.
	last := testenv.HeatUp(ctx, t, a, key, 10*time.Second, func(l lock.Lease) bool { return holdsToken(t, admin, key) == l.Token() })
	if last.Fence() <= first.Fence() {
		t.Fatalf("fence %d after %d", last.Fence(), first.Fence())
	}

	got := testenv.AcquireLater(ctx, t, b, key, 10*time.Second)
	waitQueued(t, admin, key, 1)

	before := rt.N.Load()
	last = testenv.KeptCycles(ctx, t, a, key, last, 4, true)
	if n := rt.N.Load() - before; n != 1 {
		t.Errorf("4 kept hand-offs and the release after them made %d requests, want 1 (the release)", n)
	}
	l := <-got
	if l == nil {
		return
	}
	defer l.Release(context.Background())
	if l.Fence() <= last.Fence() {
		t.Errorf("the waiting process got fence %d after the Store's local fence %d", l.Fence(), last.Fence())
	}
}

// A kept hold serves an Acquire only while more than 7/8 of the asked TTL
// is left of it; otherwise it is let go and the key taken anew.
func TestKeptHoldTooShortIsLetGo(t *testing.T) {
	a := newStore(t, newClient(t), redisstore.WithLinger(time.Hour), redisstore.WithMaxLocalHold(time.Hour))
	ctx := ctxT(t, 20*time.Second)
	key := "kept-short-" + time.Now().Format("150405.000000")
	const ttl = 400 * time.Millisecond

	testenv.AcquireRelease(ctx, t, a, key, ttl)
	kept := testenv.AcquireRelease(ctx, t, a, key, ttl)
	time.Sleep(ttl / 4)
	l, err := a.Acquire(ctx, key, ttl)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	if l.Token() == kept.Token() {
		t.Errorf("a hold with %s of its %s left served a new lease", ttl*3/4, ttl)
	}
	if l.Fence() <= kept.Fence() {
		t.Errorf("fence %d after %d", l.Fence(), kept.Fence())
	}
	if rem := time.Until(l.Deadline()); rem < ttl*7/8 {
		t.Errorf("new lease valid for %s, want about %s", rem, ttl)
	}
}

// Close lets go of the keys a Store kept: another process takes them at
// once.
func TestCloseLetsKeptKeysGo(t *testing.T) {
	admin := newClient(t)
	a, err := redisstore.New(newClient(t), redisstore.WithLinger(time.Hour), redisstore.WithMaxLocalHold(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	b := newStore(t, newClient(t))
	ctx := ctxT(t, 20*time.Second)
	key := "kept-close-" + time.Now().Format("150405.000000")

	testenv.AcquireRelease(ctx, t, a, key, 10*time.Second)
	kept := testenv.AcquireRelease(ctx, t, a, key, 10*time.Second)
	if tok := holdsToken(t, admin, key); tok != kept.Token() {
		t.Fatalf("key holds %q, want it kept (%q)", tok, kept.Token())
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	l, err := b.TryAcquire(ctx, key, 10*time.Second)
	if err != nil {
		t.Fatalf("after the keeping Store closed: %v", err)
	}
	defer l.Release(ctx)
	if l.Fence() <= kept.Fence() {
		t.Errorf("fence %d after %d", l.Fence(), kept.Fence())
	}
}

// A Release while another goroutine of the Store waits hands the key over
// with no request: the same hold, the next fence.
func TestLocalHandOffWithoutRoundTrip(t *testing.T) {
	var rt counter
	a := newStore(t, newClient(t, &rt), redisstore.WithMaxLocalHold(time.Hour))
	ctx := ctxT(t, 20*time.Second)
	key := "local-" + time.Now().Format("150405.000000")

	held, err := a.Acquire(ctx, key, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	got := testenv.AcquireLater(ctx, t, a, key, 10*time.Second)
	time.Sleep(50 * time.Millisecond) // queued in the Store
	before := rt.N.Load()
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l := <-got
	if l == nil {
		return
	}
	if n := rt.N.Load() - before; n != 0 {
		t.Errorf("the local hand-off made %d requests, want none", n)
	}
	if l.Token() != held.Token() || l.Fence() != held.Fence()+1 {
		t.Errorf("handed token %q fence %d after token %q fence %d; want the same hold, the next fence",
			l.Token(), l.Fence(), held.Token(), held.Fence())
	}
	select {
	case <-held.Done():
	default:
		t.Error("the released lease's Done is open")
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// Past WithMaxLocalHandOffs, a Store goes on handing a key on among its own
// leases only within WithMaxLocalHold after it took the key from Redis;
// then a Release lets it go, and the next Acquire takes it anew.
func TestMaxLocalHoldLetsKeyGo(t *testing.T) {
	admin := newClient(t)
	const maxHold = 100 * time.Millisecond
	a := newStore(t, newClient(t), redisstore.WithLinger(time.Hour),
		redisstore.WithMaxLocalHandOffs(1), redisstore.WithMaxLocalHold(maxHold))
	ctx := ctxT(t, 20*time.Second)
	key := "max-hold-" + time.Now().Format("150405.000000")

	testenv.AcquireRelease(ctx, t, a, key, 10*time.Second)
	taken := testenv.AcquireRelease(ctx, t, a, key, 10*time.Second) // hot: kept (the first hand-off)
	l, err := a.Acquire(ctx, key, 10*time.Second)                   // the second, within maxHold
	if err != nil {
		t.Fatal(err)
	}
	if l.Token() != taken.Token() {
		t.Fatalf("a hand-off past WithMaxLocalHandOffs but within WithMaxLocalHold took a new hold")
	}
	time.Sleep(maxHold)
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if tok := holdsToken(t, admin, key); tok != "" {
		t.Errorf("a Release past both bounds left the key held by %q", tok)
	}
	next, err := a.Acquire(ctx, key, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer next.Release(ctx)
	if next.Token() == l.Token() || next.Fence() <= l.Fence() {
		t.Errorf("token %q fence %d after token %q fence %d; want a new hold with a higher fence",
			next.Token(), next.Fence(), l.Token(), l.Fence())
	}
}

// A Refresh still in flight when its lease is released (and its hold kept
// for the Store's next Acquire) must not release the hold when its reply
// comes: the hold is the next lease's now.
func TestLateRefreshSparesKeptHold(t *testing.T) {
	admin := newClient(t)
	a := newStore(t, newClient(t, testenv.SlowScript{SHA: rediskit.Refresh.Hash(), Delay: 300 * time.Millisecond}),
		redisstore.WithLinger(time.Hour), redisstore.WithMaxLocalHold(time.Hour))
	ctx := ctxT(t, 20*time.Second)
	key := "late-refresh-" + time.Now().Format("150405.000000")

	testenv.AcquireRelease(ctx, t, a, key, 10*time.Second)
	l, err := a.Acquire(ctx, key, 10*time.Second) // hot
	if err != nil {
		t.Fatal(err)
	}
	testenv.RefreshAcrossRelease(ctx, t, l)
	next, err := a.Acquire(ctx, key, 10*time.Second) // the kept hold
	if err != nil {
		t.Fatal(err)
	}
	defer next.Release(ctx)
	if next.Token() != l.Token() {
		t.Fatalf("the kept hold did not serve the next Acquire")
	}
	if tok := holdsToken(t, admin, key); tok != next.Token() {
		t.Errorf("the late Refresh's clean-up let the next lease's hold go: the key holds %q", tok)
	}
}

// WithMaxLocalHandOffs(0) keeps nothing, and its fences are every Store's
// (a hold's range): Stores with and without hand-offs can share keys.
func TestNoHandOffsPlainCounter(t *testing.T) {
	admin := newClient(t)
	a := newStore(t, newClient(t), redisstore.WithMaxLocalHandOffs(0))
	ctx := ctxT(t, 20*time.Second)
	key := "plain-" + time.Now().Format("150405.000000")
	first := testenv.AcquireRelease(ctx, t, a, key, 10*time.Second)
	l, err := a.Acquire(ctx, key, 10*time.Second) // hot, but nothing is kept
	if err != nil {
		t.Fatal(err)
	}
	// The same fences as any Store's: the key keeps the hold's last.
	if _, fence := lockValue(t, admin, "oncekit:lock:{"+key+"}"); fence != l.Fence()+rediskit.HoldFences-1 {
		t.Errorf("the key's fence %d, want %d", fence, l.Fence()+rediskit.HoldFences-1)
	}
	if l.Token() == first.Token() || l.Fence() <= first.Fence() {
		t.Errorf("token %q fence %d after token %q fence %d", l.Token(), l.Fence(), first.Token(), first.Fence())
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if tok := holdsToken(t, admin, key); tok != "" {
		t.Errorf("Release kept the key (%q) with hand-offs off", tok)
	}
}

// A kept hold that nobody takes for its whole linger cools the key: the
// Store's next Release of it lets it go at once (two processes taking
// turns are not slowed by holds kept for nothing).
func TestUnusedKeptHoldCoolsKey(t *testing.T) {
	admin := newClient(t)
	// A linger long enough for the check below to read the kept hold on a
	// loaded machine (a -race run of every package).
	const linger = 200 * time.Millisecond
	a := newStore(t, newClient(t), redisstore.WithLinger(linger))
	ctx := ctxT(t, 20*time.Second)
	key := "cool-" + time.Now().Format("150405.000000")

	testenv.AcquireRelease(ctx, t, a, key, 10*time.Second)
	testenv.HeatUp(ctx, t, a, key, 10*time.Second, func(l lock.Lease) bool { // hot: kept
		return holdsToken(t, admin, key) == l.Token()
	})
	// Unused: let go when the linger runs out, and the key cools.
	for deadline := time.Now().Add(linger + 2*time.Second); holdsToken(t, admin, key) != ""; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the linger ran out and the key still holds %q", holdsToken(t, admin, key))
		}
	}
	testenv.AcquireRelease(ctx, t, a, key, 10*time.Second) // asked again soon, but cooling
	if tok := holdsToken(t, admin, key); tok != "" {
		t.Errorf("a cooling key's Release kept it (%q)", tok)
	}
}
