package ctxbound

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

// Contexts asked for Done end at their deadlines, in any order of
// deadlines and whatever others ended before theirs, on the one shared
// timer; those ended early leave it at once, so nothing stays behind.
// (Leases share the timer: lease_test.go covers their expiry and refresh.)
func TestDeadlinesEndOnTheSharedTimer(t *testing.T) {
	const n = 200
	start := time.Now()
	type entry struct {
		ctx    context.Context
		cancel context.CancelFunc
		early  bool
	}
	entries := make([]entry, n)
	for i := range entries {
		early := i%3 == 0
		d := time.Duration(20+rand.IntN(200)) * time.Millisecond
		if early && i%2 == 0 {
			d = time.Hour // would stay on the timer for an hour if not let go
		}
		ctx, cancel := Bounded(context.Background(), start.Add(d))
		entries[i] = entry{ctx, cancel, early}
		_ = ctx.Done() // joins the shared timer
	}
	for _, e := range entries {
		if e.early {
			e.cancel()
			if e.ctx.Err() != context.Canceled {
				t.Fatalf("cancelled: %v", e.ctx.Err())
			}
		}
	}
	var wg sync.WaitGroup
	for _, e := range entries {
		if e.early {
			continue
		}
		wg.Go(func() {
			select {
			case <-e.ctx.Done():
			case <-time.After(10 * time.Second):
				t.Error("a context did not end at its deadline")
				return
			}
			dl, _ := e.ctx.Deadline()
			if time.Now().Before(dl) || e.ctx.Err() != context.DeadlineExceeded {
				t.Errorf("ended before its deadline (%v early) or not by it: %v", time.Until(dl), e.ctx.Err())
			}
		})
	}
	wg.Wait()
	for _, e := range entries {
		e.cancel()
	}
	left := 0
	deadlines.mu.Lock()
	for _, e := range entries {
		if e.ctx.(*bounded).expiry.index != 0 {
			left++
		}
	}
	deadlines.mu.Unlock()
	if left != 0 {
		t.Errorf("%d ended contexts stay on the shared timer", left)
	}
}
