package redisstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/observe"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/storage/redisstore"
)

// waitQueued waits until n processes are queued for key.
func waitQueued(t *testing.T, c *redis.Client, key string, n int64) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if got, _ := c.ZCard(context.Background(), "oncekit:lock:{"+key+"}:q").Result(); got == n {
			return
		}
	}
	t.Fatalf("%d processes never queued for %q", n, key)
}

// A release grants the key to the first waiting process: the waiter holds
// it without another request, with a fence above the releaser's, and the
// hand-off is reported.
func TestReleaseGrantsToWaitingProcess(t *testing.T) {
	admin := newClient(t)
	var rt counter
	ev := testenv.NewEvents()
	holder := newStore(t, newClient(t))
	waiter := newStore(t, newClient(t, &rt), redisstore.WithObserver(ev))
	ctx := ctxT(t, 20*time.Second)
	key := "grant-" + time.Now().Format("150405.000000")

	held, err := holder.Acquire(ctx, key, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	got := testenv.AcquireLater(ctx, t, waiter, key, 10*time.Second)
	waitQueued(t, admin, key, 1)
	before := rt.N.Load()
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l := <-got
	if l == nil {
		return
	}
	defer l.Release(context.Background())
	if n := rt.N.Load() - before; n != 0 {
		t.Errorf("the waiter sent %d requests after the release; a grant needs none", n)
	}
	if l.Fence() <= held.Fence() {
		t.Errorf("granted fence %d after the releaser's %d", l.Fence(), held.Fence())
	}
	if tok, _ := admin.Get(ctx, "oncekit:lock:{"+key+"}").Result(); tok != l.Token() {
		t.Errorf("the key holds %q, the granted lease's token is %q", tok, l.Token())
	}
	if time.Until(l.Deadline()) < 9*time.Second {
		t.Errorf("granted lease valid for %s, want about its 10 s TTL", time.Until(l.Deadline()))
	}
	if hs := ev.Of(observe.LockHandOff); len(hs) != 1 || hs[0].Outcome != observe.Notified || hs[0].Fence != l.Fence() {
		t.Errorf("hand-off events %+v, want one, notified, with the granted fence", hs)
	}
	if qx, _ := admin.HGetAll(ctx, "oncekit:lock:{"+key+"}:qx").Result(); len(qx) != 0 {
		t.Errorf("the granted process is still queued: %v", qx)
	}
}

// A queued process that asked for grants but receives nothing on its
// channel (it died: its subscription went with its connections) is not
// granted the key; it is dropped, and the key is free.
func TestGrantSkipsProcessNobodyListensFor(t *testing.T) {
	c := newClient(t)
	s := newStore(t, c)
	ctx := ctxT(t, 20*time.Second)
	key := "grant-dead-" + time.Now().Format("150405.000000")
	q, qx := "oncekit:lock:{"+key+"}:q", "oncekit:lock:{"+key+"}:qx"
	held, err := s.Acquire(ctx, key, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.ZAdd(ctx, q, redisZ(0, "dead")).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.HSet(ctx, qx, "dead", time.Now().UnixMilli()+60_000, "dead|g", "deadtoken|10000").Err(); err != nil {
		t.Fatal(err)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if tok, err := c.Get(ctx, "oncekit:lock:{"+key+"}").Result(); !errors.Is(err, redis.Nil) {
		t.Errorf("after the release the key holds %q (%v); want it free", tok, err)
	}
	if n, _ := c.ZCard(ctx, q).Result(); n != 0 {
		t.Errorf("%d processes still queued; want the dead one dropped", n)
	}
}

// A waiter that gives up while the key is granted to it (the grant's
// message lost, or on its way) gives the key back: nothing is left held for
// a token nobody uses.
func TestWaiterLeavingGivesGrantBack(t *testing.T) {
	admin := newClient(t)
	holder := newStore(t, newClient(t))
	waiter := newStore(t, newClient(t))
	ctx := ctxT(t, 20*time.Second)
	key := "grant-left-" + time.Now().Format("150405.000000")
	lockName, qx := "oncekit:lock:{"+key+"}", "oncekit:lock:{"+key+"}:qx"
	held, err := holder.Acquire(ctx, key, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(context.Background())
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := waiter.Acquire(wctx, key, 10*time.Second)
		done <- err
	}()
	waitQueued(t, admin, key, 1)
	fields, err := admin.HGetAll(ctx, qx).Result()
	if err != nil {
		t.Fatal(err)
	}
	var tok string
	for f, v := range fields {
		if strings.HasSuffix(f, "|g") {
			tok, _, _ = strings.Cut(v, "|")
		}
	}
	if tok == "" {
		t.Fatalf("the waiter did not ask for grants: %v", fields)
	}
	// The key is the waiter's, as a grant would leave it; its message is lost.
	if err := admin.Set(ctx, lockName, tok, 10*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-done; !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("cancelled Acquire: %v", err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		cur, err := admin.Get(ctx, lockName).Result()
		if errors.Is(err, redis.Nil) || cur != tok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the key stayed held for the token of a waiter that left")
		}
	}
}
