package zkstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/storage/zkstore"
)

// A holder cut off from the ensemble (a TCP proxy that holds every byte)
// loses its session: its lease's Done closes before the servers expire the
// session and give the key to another client, whose fence is higher; the
// old holder's Release then reports the loss. Once the network is back,
// the cut-off Store works again with a new session.
func TestHolderSessionExpired(t *testing.T) {
	addrs := testenv.ZooKeeperAddrs(t)
	proxy := testenv.StartProxy(t, addrs[0])
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cut, err := zkstore.Connect(ctx, []string{proxy.Addr}, zkstore.WithSessionTimeout(sessionTimeout))
	if err != nil {
		t.Fatal(err)
	}
	defer cut.Close()
	other := connect(t)
	key := "session-expired-" + time.Now().Format(time.RFC3339Nano)
	held, err := cut.Acquire(ctx, key, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	done := held.Done()

	proxy.Stall()
	stalled := time.Now()
	next, err := other.Acquire(ctxT(t, 20*time.Second), key, time.Minute)
	if err != nil {
		t.Fatalf("Acquire while the holder is cut off: %v", err)
	}
	took := time.Now()
	defer next.Release(context.Background())
	select {
	case <-done:
	default:
		t.Fatalf("another client holds the key %s after the cut, and the cut-off holder's Done is still open", took.Sub(stalled))
	}
	if next.Fence() <= held.Fence() {
		t.Errorf("fence after the session expired %d, not above the old holder's %d", next.Fence(), held.Fence())
	}
	t.Logf("cut off: the key was taken by another client after %s (session timeout %s)", took.Sub(stalled).Round(time.Millisecond), sessionTimeout)

	proxy.Resume()
	if err := held.Release(ctxT(t, 10*time.Second)); !errors.Is(err, lock.ErrLockLost) {
		t.Errorf("Release by the holder whose session expired: %v, want ErrLockLost", err)
	}
	// Once it has a new session, the Store takes other keys again (until
	// then a request fails at once: the client is not connected).
	var l lock.Lease
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if l, err = cut.Acquire(ctxT(t, 5*time.Second), key+"-after", time.Minute); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatalf("Acquire after the network came back: %v", err)
	}
	_ = l.Release(context.Background())
	// Its idempotency records do not depend on the session.
	c, err := cut.Begin(ctxT(t, 10*time.Second), idemdriver.MustKey(key+"-record"), "fp", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := cut.Complete(ctxT(t, 10*time.Second), c, []byte("ok"), time.Minute); err != nil {
		t.Fatal(err)
	}
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// A waiter whose deadline passes while its request to join the queue is
// held on the wire leaves nothing behind once Acquire has returned: the
// key's queue never gets a node of it afterwards (before, the node was
// created after the return and deleted later in the background, so a
// TryAcquire in between found the key busy).
func TestCancelledJoinLeavesNothingBehind(t *testing.T) {
	proxy := testenv.StartProxy(t, testenv.ZooKeeperAddrs(t)[0])
	cut := connectTo(t, proxy.Addr)
	other := connect(t)
	key := "cancelled-join-" + time.Now().Format(time.RFC3339Nano)
	held, err := other.Acquire(ctxT(t, 10*time.Second), key, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(context.Background())

	proxy.Stall()
	resumed := make(chan struct{})
	time.AfterFunc(300*time.Millisecond, func() { proxy.Resume(); close(resumed) })
	_, err = cut.Acquire(ctxT(t, 100*time.Millisecond), key, time.Minute)
	if !errors.Is(err, lock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire past its deadline: %v, want ErrNotAcquired and DeadlineExceeded", err)
	}
	// other may talk to a follower the cancelled Acquire's clean-up has
	// not reached yet: a sync first makes the read see every write
	// committed before it (ZooKeeper reads are not linearizable otherwise).
	if _, err := other.Conn().Sync(zkstore.LockDir(other, key)); err != nil {
		t.Fatal(err)
	}
	kids, _, changed, err := other.Conn().ChildrenW(zkstore.LockDir(other, key))
	if err != nil {
		t.Fatal(err)
	}
	if len(kids) != 1 {
		t.Errorf("the key's queue once the cancelled Acquire returned: %v, want the holder's node only", kids)
	}
	<-resumed
	select {
	case ev := <-changed:
		t.Fatalf("the key's queue changed after the cancelled Acquire had returned: %v", ev)
	case <-time.After(500 * time.Millisecond):
	}
}

// A Begin whose deadline passes while its create is held on the wire gives
// its claim back before it returns: the record is never there afterwards.
func TestCancelledBeginLeavesNothingBehind(t *testing.T) {
	proxy := testenv.StartProxy(t, testenv.ZooKeeperAddrs(t)[0])
	cut := connectTo(t, proxy.Addr)
	other := connect(t)
	key := "cancelled-begin-" + time.Now().Format(time.RFC3339Nano)
	// The record's bucket directory exists, the record does not (an
	// abandoned one stays, for the next claim's attempt): the held request
	// is the create.
	if _, err := other.Begin(ctxT(t, 10*time.Second), idemdriver.MustKey(key), "fp", time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := other.DeleteRecord(ctxT(t, 10*time.Second), key); err != nil {
		t.Fatal(err)
	}

	proxy.Stall()
	resumed := make(chan struct{})
	time.AfterFunc(300*time.Millisecond, func() { proxy.Resume(); close(resumed) })
	if _, err := cut.Begin(ctxT(t, 100*time.Millisecond), idemdriver.MustKey(key), "fp", time.Minute); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Begin past its deadline: %v, want DeadlineExceeded", err)
	}
	// A sync first, as in TestCancelledJoinLeavesNothingBehind: other may
	// talk to a follower behind the clean-up's delete.
	if _, err := other.Conn().Sync(zkstore.RecordPath(other, key)); err != nil {
		t.Fatal(err)
	}
	there, _, changed, err := other.Conn().ExistsW(zkstore.RecordPath(other, key))
	if err != nil {
		t.Fatal(err)
	}
	if there {
		t.Error("the record is there once the cancelled Begin returned")
	}
	<-resumed
	select {
	case ev := <-changed:
		t.Fatalf("the record changed after the cancelled Begin had returned: %v", ev)
	case <-time.After(500 * time.Millisecond):
	}
}

// A Begin whose deadline passes while its takeover of an abandoned record
// is held on the wire gives the claim back when the write lands after it
// returned: the next Begin claims the key at once (before, the key stayed
// in flight, claimed by nobody, for the whole lease), and its attempt
// counts the claim given back (over-counting is allowed, never under).
func TestCancelledTakeoverGivesTheClaimBack(t *testing.T) {
	proxy := testenv.StartProxy(t, testenv.ZooKeeperAddrs(t)[0])
	cut := connectTo(t, proxy.Addr)
	other := connect(t)
	key := idemdriver.MustKey("cancelled-takeover-" + time.Now().Format(time.RFC3339Nano))
	first, err := other.Begin(ctxT(t, 10*time.Second), key, "fp", time.Minute)
	if err != nil || first.State != idemdriver.Acquired {
		t.Fatalf("Begin: %+v %v", first, err)
	}
	if err := other.Abandon(ctxT(t, 10*time.Second), first); err != nil {
		t.Fatal(err)
	}

	proxy.StallWhen(testenv.ZooKeeperOp(5)) // the takeover's setData; the create and the read go through
	resumed := make(chan struct{})
	time.AfterFunc(time.Second, func() { proxy.Resume(); close(resumed) })
	if _, err := cut.Begin(ctxT(t, 500*time.Millisecond), key, "fp", time.Minute); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Begin past its deadline: %v, want DeadlineExceeded", err)
	}
	<-resumed
	var c idemdriver.Claim
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		// (a sync first: other may talk to a follower behind the give-back)
		if _, err := other.Conn().Sync(zkstore.RecordPath(other, key.String())); err != nil {
			t.Fatal(err)
		}
		if c, err = other.Begin(ctxT(t, 5*time.Second), key, "fp", time.Minute); err != nil {
			t.Fatal(err)
		}
		if c.State == idemdriver.Acquired || time.Now().After(deadline) {
			break
		}
	}
	if c.State != idemdriver.Acquired || c.Attempt < 2 {
		t.Fatalf("Begin after the cancelled takeover: %v attempt %d, want acquired (the claim given back), attempt 2 or more", c.State, c.Attempt)
	}
}

// connectTo is connect through addr (a proxy).
func connectTo(t *testing.T, addr string) *zkstore.Store {
	t.Helper()
	s, err := zkstore.Connect(ctxT(t, 10*time.Second), []string{addr}, zkstore.WithSessionTimeout(sessionTimeout))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// A record stamped by a leader that an election replaced is written again
// by the next Begin that finds its lease over, not taken over: the two
// leaders' clocks are never compared (on one machine they agree, so here
// the takeover waits one lease more than it needs to; across machines
// whose clocks disagree by more than a lease, it is what keeps a live
// claim its own). The holder finishes its claim after the rewrite.
func TestRecordStampedByFormerLeader(t *testing.T) {
	members := testenv.StartZooKeeper(t, 3)
	var addrs []string
	for _, m := range members {
		addrs = append(addrs, m.Addr)
	}
	ctx := ctxT(t, 150*time.Second)
	connectTo := func() *zkstore.Store {
		s, err := zkstore.Connect(ctx, addrs, zkstore.WithSessionTimeout(4*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	holder := connectTo()
	const key, lease = "former-leader", time.Second
	c, err := holder.Begin(ctx, idemdriver.MustKey(key), "fp", lease)
	if err != nil || c.State != idemdriver.Acquired {
		t.Fatalf("Begin: %+v %v", c, err)
	}
	testenv.ZooKeeperLeader(t, members).Kill()
	testenv.ZooKeeperLeader(t, members) // a new leader, a new epoch
	time.Sleep(lease + 200*time.Millisecond)
	other := connectTo()
	var c2 idemdriver.Claim
	for deadline := time.Now().Add(40 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if c2, err = other.Begin(ctx, idemdriver.MustKey(key), "fp", lease); err == nil || time.Now().After(deadline) {
			break // (the ensemble may refuse requests while it settles)
		}
	}
	if err != nil || c2.State != idemdriver.InFlight {
		t.Fatalf("Begin after the lease ran out under a former leader: %v %v, want in flight (stamped again, not taken over)", c2.State, err)
	}
	if err := holder.Complete(ctx, c, []byte("once"), time.Minute); err != nil {
		t.Fatalf("the holder's Complete after the rewrite: %v", err)
	}
	if c3, err := other.Begin(ctx, idemdriver.MustKey(key), "fp", lease); err != nil || c3.State != idemdriver.Completed || string(c3.Result) != "once" {
		t.Fatalf("Begin after the holder completed: %+v %v, want the result replayed", c3, err)
	}
}
