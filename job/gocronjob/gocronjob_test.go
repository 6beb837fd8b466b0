package gocronjob_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/oncekit/oncekit/job/gocronjob"
	"github.com/oncekit/oncekit/storage/memstore"
)

// Three gocron schedulers share a store through the Locker: each run of
// the job happens on one of them, not on all three.
func TestOneSchedulerRunsEachRun(t *testing.T) {
	store := memstore.New()
	defer store.Close()
	var runs [3]atomic.Int64
	start := time.Now().Truncate(200 * time.Millisecond).Add(400 * time.Millisecond)
	for i := range 3 {
		l, err := gocronjob.NewLocker(store, gocronjob.WithHoldAtLeast(100*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		s, err := gocron.NewScheduler(gocron.WithDistributedLocker(l))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.NewJob(gocron.DurationJob(200*time.Millisecond), gocron.NewTask(func() { runs[i].Add(1) }),
			gocron.WithName("report"), gocron.WithStartAt(gocron.WithStartDateTime(start))); err != nil {
			t.Fatal(err)
		}
		s.Start()
		defer func() { _ = s.Shutdown() }()
	}
	time.Sleep(time.Until(start) + 1100*time.Millisecond) // runs at +0, +200, …, +1000 ms: 6
	total := runs[0].Load() + runs[1].Load() + runs[2].Load()
	if total < 4 || total > 7 {
		t.Errorf("%d runs in 6 periods across three schedulers (%d, %d, %d): want one per period", total, runs[0].Load(), runs[1].Load(), runs[2].Load())
	}
}

// A lock is held at least the hold after it was taken, then released.
func TestHoldAtLeast(t *testing.T) {
	store := memstore.New()
	defer store.Close()
	l, err := gocronjob.NewLocker(store, gocronjob.WithHoldAtLeast(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	k, err := l.Lock(ctx, "report")
	if err != nil {
		t.Fatal(err)
	}
	if err := k.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Lock(ctx, "report"); err == nil {
		t.Fatal("the lock was free right after its Unlock, before the hold")
	}
	time.Sleep(300 * time.Millisecond)
	k, err = l.Lock(ctx, "report")
	if err != nil {
		t.Fatalf("the lock is still held after the hold: %v", err)
	}
	_ = k.Unlock(ctx)
	if _, err := gocronjob.NewLocker(nil); err == nil {
		t.Error("NewLocker(nil): nil error")
	}
}
