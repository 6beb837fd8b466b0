package zkstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

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
	c, err := cut.Begin(ctxT(t, 10*time.Second), key+"-record", "fp", time.Minute)
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
