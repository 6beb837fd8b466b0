package sqlstore

import (
	"context"
	"errors"
	"testing"
	"time"
)

// enterLater runs gates.enter in a goroutine; its outcome comes on the
// channel.
func enterLater(ctx context.Context, g *gates, stop <-chan struct{}, key string) <-chan error {
	out := make(chan error, 1)
	go func() {
		leave, handed, err := g.enter(ctx, stop, key, time.Second)
		switch {
		case err != nil:
		case handed != nil:
			err = errors.New("handed a lease")
		default:
			leave()
		}
		out <- err
	}()
	return out
}

func waitQueue(t *testing.T, g *gates, key string, n int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		g.mu.Lock()
		k := g.m[key]
		got := 0
		if k != nil {
			got = k.queue.Len()
		}
		g.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d acquisitions queued, want %d", got, n)
		}
	}
}

func idle(t *testing.T, g *gates) {
	t.Helper()
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.m) != 0 {
		t.Errorf("%d gates left behind, want none", len(g.m))
	}
}

// A waiter taken out of the queue for a hand-off that did not happen,
// whose ctx ended meanwhile, gets a turn of its own and hands it on: its
// enter returns the ctx's error, and nothing is left behind.
func TestGateGiveBackToACancelledWaiter(t *testing.T) {
	var g gates
	stop := make(chan struct{})
	leave, _, err := g.enter(t.Context(), stop, "k", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := enterLater(ctx, &g, stop, "k")
	waitQueue(t, &g, "k", 1)
	w := g.first("k")
	if w == nil {
		t.Fatal("no waiter to hand off to")
	}
	cancel()
	time.Sleep(20 * time.Millisecond) // the waiter sees its ctx end, out of the queue
	g.giveBack("k", w)
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled waiter: %v, want context.Canceled", err)
	}
	leave()
	idle(t, &g)
}

// While a lease of the Store holds the key, acquisitions wait in the
// process even when no acquisition holds the turn; when the Store lets
// the key go (unhold), the first gets the turn.
func TestGateWaitsWhileTheStoreHolds(t *testing.T) {
	var g gates
	stop := make(chan struct{})
	h := &hold{}
	g.hold("k", h)
	done := enterLater(t.Context(), &g, stop, "k")
	waitQueue(t, &g, "k", 1)
	select {
	case err := <-done:
		t.Fatalf("an acquisition got the turn while the Store held the key (%v)", err)
	case <-time.After(20 * time.Millisecond):
	}
	g.unhold("k", &hold{}) // another hold's end changes nothing
	waitQueue(t, &g, "k", 1)
	g.unhold("k", h)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	idle(t, &g)
}

// A Store that closes ends the waits in its gates.
func TestGateClosed(t *testing.T) {
	var g gates
	stop := make(chan struct{})
	leave, _, err := g.enter(t.Context(), stop, "k", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	done := enterLater(t.Context(), &g, stop, "k")
	waitQueue(t, &g, "k", 1)
	close(stop)
	if err := <-done; !errors.Is(err, errGateClosed) {
		t.Errorf("waiter at close: %v, want errGateClosed", err)
	}
	leave()
	idle(t, &g)
}
