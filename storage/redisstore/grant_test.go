package redisstore_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
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
	if tok, _ := lockValue(t, admin, "oncekit:lock:{"+key+"}"); tok != l.Token() {
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
	flagWaiters(t, c, "oncekit:lock:{"+key+"}")
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if tok, _ := lockValue(t, c, "oncekit:lock:{"+key+"}"); tok != "" {
		t.Errorf("after the release the key holds %q; want it free", tok)
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
	_, fence := lockValue(t, admin, lockName)
	if err := admin.Set(ctx, lockName, fmt.Sprintf("L1|%s|%d|w", tok, fence+1), 10*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-done; !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("cancelled Acquire: %v", err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if cur, _ := lockValue(t, admin, lockName); cur != tok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the key stayed held for the token of a waiter that left")
		}
	}
}

// grantGate holds back, once armed, every read of a connection that carries
// a grant ("g|<token>|<fence>" on a waiter's own channel) until opened: the
// waiting process reads its grant late, as one stalled by GC or a slow
// pub/sub connection would.
type grantGate struct {
	armed  atomic.Bool
	opened chan struct{}
}

func (g *grantGate) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &gatedConn{Conn: c, g: g}, nil
}

type gatedConn struct {
	net.Conn
	g *grantGate
}

func (c *gatedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if c.g.armed.Load() && bytes.Contains(p[:n], []byte("g|")) {
		<-c.g.opened
	}
	return n, err
}

// scriptCalls counts a client's completed script calls.
type scriptCalls struct{ n atomic.Int64 }

func (h *scriptCalls) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *scriptCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if n := cmd.Name(); n == "evalsha" || n == "eval" {
			h.n.Add(1)
		}
		return err
	}
}
func (h *scriptCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A grant read after the waiter's next attempt found another holder is
// older than that attempt: the key it granted expired unused and the other
// holder took it. The waiter must not build a lease on it (two holders at
// once); it goes on waiting and gets the key when the other holder lets it
// go, with a higher fence.
//
// Interleaving: W (TTL 150 ms) waits for H's key; H releases, the release
// grants W; W's read of the grant stalls; W's key expires and X takes it;
// W's recheck attempt finds X holding; then W reads the grant.
func TestLateGrantIsDropped(t *testing.T) {
	admin := newClient(t)
	gate := &grantGate{opened: make(chan struct{})}
	var opened sync.Once
	open := func() { opened.Do(func() { close(gate.opened) }) }
	t.Cleanup(open)
	calls := &scriptCalls{}
	wc := redis.NewClient(&redis.Options{Addr: testenv.RedisAddrs(t, 1)[0], Dialer: gate.dial})
	wc.AddHook(calls)
	t.Cleanup(func() { _ = wc.Close() })
	holder := newStore(t, newClient(t))
	other := newStore(t, newClient(t))
	waiter := newStore(t, wc, redisstore.WithRecheckInterval(600*time.Millisecond))
	ctx := ctxT(t, 20*time.Second)
	key := "grant-late-" + time.Now().Format("150405.000000")
	const wttl = 150 * time.Millisecond

	held, err := holder.Acquire(ctx, key, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		l   lock.Lease
		err error
		at  time.Time
	}
	got := make(chan result, 1)
	gate.armed.Store(true)
	go func() {
		l, err := waiter.Acquire(ctx, key, wttl)
		got <- result{l, err, time.Now()}
	}()
	waitQueued(t, admin, key, 1)
	if err := held.Release(ctx); err != nil { // grants the key to W, whose read stalls
		t.Fatal(err)
	}
	var x lock.Lease
	for x == nil { // X polls until W's granted key expires
		if x, err = other.TryAcquire(ctx, key, 10*time.Second); err != nil && !errors.Is(err, lock.ErrNotAcquired) {
			t.Fatal(err)
		}
		if ctx.Err() != nil {
			t.Fatal("X never took the key")
		}
		time.Sleep(2 * time.Millisecond)
	}
	// W's next attempt (its recheck) finds X holding; then W reads the grant.
	before := calls.n.Load()
	for calls.n.Load() == before {
		if ctx.Err() != nil {
			t.Fatal("W never tried again")
		}
		time.Sleep(time.Millisecond)
	}
	open()
	select {
	case r := <-got:
		if r.l != nil {
			defer r.l.Release(context.Background())
		}
		t.Fatalf("W acquired (lease %v, err %v) while X (fence %d) holds the key: a late grant made two holders", r.l != nil, r.err, x.Fence())
	case <-time.After(300 * time.Millisecond):
	}
	released := time.Now()
	if err := x.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatalf("W after X's release: %v", r.err)
	}
	defer r.l.Release(context.Background())
	if r.at.Before(released) {
		t.Errorf("W's lease began %s before X released", released.Sub(r.at))
	}
	if r.l.Fence() <= x.Fence() {
		t.Errorf("W's fence %d is not above X's %d", r.l.Fence(), x.Fence())
	}
}
