package job_test

import (
	"context"
	"fmt"
	"time"

	"github.com/oncekit/oncekit/job"
	"github.com/oncekit/oncekit/storage/memstore"
)

// Three replicas run the same job on one store: each tick runs once, on
// one of them. (On a real deployment each replica is a process, and the
// store one they share: Redis, etcd, SQL, ZooKeeper.)
func Example() {
	store := memstore.New()
	defer store.Close()
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan job.Tick, 16)
	for range 3 {
		go job.Run(ctx, store, "nightly-report", job.Every(50*time.Millisecond), func(ctx context.Context, t job.Tick) error {
			ran <- t // t.At: the scheduled time, the same on every replica; t.Fence goes to what the run writes
			return nil
		})
	}
	first, second := <-ran, <-ran
	cancel()
	fmt.Println("two ticks, each run once:", !first.At.Equal(second.At), second.At.Sub(first.At))
	// Output: two ticks, each run once: true 50ms
}

// A cron schedule (robfig/cron/v3's cron.ParseStandard gives one) ticks
// at instants every replica agrees on, by UTC's clock unless it names its
// zone; job.Every ticks at the multiples of its interval since the epoch.
func ExampleEvery() {
	at := time.Date(2026, 12, 5, 10, 7, 30, 0, time.UTC)
	fmt.Println(job.Every(5 * time.Minute).Next(at).Format(time.TimeOnly))
	// Output: 10:10:00
}
