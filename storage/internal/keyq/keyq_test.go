package keyq

import (
	"context"
	"sync"
	"testing"
	"time"
)

func TestFIFOAndCancel(t *testing.T) {
	var q Queue
	ctx := t.Context()
	if err := q.Lock(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if q.TryLock("k") {
		t.Fatal("TryLock on a held key succeeded")
	}
	order := make(chan int, 3)
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Go(func() {
			if err := q.Lock(ctx, "k"); err != nil {
				t.Error(err)
				return
			}
			order <- i
			q.Unlock("k")
		})
		// Let each waiter queue before the next one.
		for q.waiting("k") != i+1 {
			time.Sleep(time.Millisecond)
		}
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	if err := q.Lock(cctx, "k"); err == nil {
		t.Fatal("Lock past its deadline succeeded")
	}
	q.Unlock("k")
	wg.Wait()
	close(order)
	want := 0
	for got := range order {
		if got != want {
			t.Fatalf("waiter %d ran, want %d: not FIFO", got, want)
		}
		want++
	}
	if !q.TryLock("k") {
		t.Fatal("key not free after every holder unlocked")
	}
	q.Unlock("k")
	if len(q.m) != 0 {
		t.Fatalf("%d entries left behind", len(q.m))
	}
}

func (q *Queue) waiting(key string) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	if e := q.m[key]; e != nil {
		return e.waiters.Len()
	}
	return 0
}
