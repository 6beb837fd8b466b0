package job_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/oncekit/oncekit/job"
	"github.com/oncekit/oncekit/storage/memstore"
)

// ledger records the runs of a job's ticks.
type ledger struct {
	mu          sync.Mutex
	runs        map[time.Time]int
	by          map[time.Time][]string
	inside, max atomic.Int64
}

func newLedger() *ledger { return &ledger{runs: map[time.Time]int{}, by: map[time.Time][]string{}} }

func (l *ledger) ran(replica string, t job.Tick) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.runs[t.At]++
	l.by[t.At] = append(l.by[t.At], replica)
}

// replicas runs one job.Run per clock skew until ctx ends.
func replicas(ctx context.Context, t *testing.T, store job.Store, sched job.Schedule, skews map[string]time.Duration,
	fn func(replica string) func(context.Context, job.Tick) error, opts ...job.Option) *sync.WaitGroup {
	var wg sync.WaitGroup
	for name, skew := range skews {
		wg.Go(func() {
			err := job.Run(ctx, store, "report", sched, fn(name), append([]job.Option{job.WithClock(func() time.Time { return time.Now().Add(skew) })}, opts...)...)
			if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
				t.Errorf("replica %s: Run returned %v", name, err)
			}
		})
	}
	return &wg
}

// Three replicas whose clocks disagree by up to 800 ms run each tick once:
// the one whose clock is ahead runs it, the others find it done.
func TestEachTickOnceDespiteSkew(t *testing.T) {
	store := memstore.New()
	defer store.Close()
	l := newLedger()
	start := time.Now()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	replicas(ctx, t, store, job.Every(200*time.Millisecond), map[string]time.Duration{"late": -300 * time.Millisecond, "exact": 0, "early": 500 * time.Millisecond},
		func(replica string) func(context.Context, job.Tick) error {
			return func(ctx context.Context, tk job.Tick) error {
				if tk.Fence == 0 {
					t.Errorf("tick %s without a fence", tk.At)
				}
				l.ran(replica, tk)
				return nil
			}
		}).Wait()
	end := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	for at, n := range l.runs {
		if n != 1 {
			t.Errorf("tick %s ran %d times (%v)", at.Format("15:04:05.000"), n, l.by[at])
		}
	}
	for at := job.Every(200 * time.Millisecond).Next(start.Add(time.Second)); at.Before(end.Add(-time.Second)); at = at.Add(200 * time.Millisecond) {
		if l.runs[at] != 1 {
			t.Errorf("tick %s ran %d times, want once", at.Format("15:04:05.000"), l.runs[at])
		}
		if by := l.by[at]; len(by) == 1 && by[0] != "early" {
			t.Errorf("tick %s ran on %s, not on the replica whose clock reached it first", at.Format("15:04:05.000"), by[0])
		}
	}
}

// A run longer than its period holds the job's lock: the ticks that come
// meanwhile wait for it until the tick after, then are skipped; two runs
// never overlap.
func TestRunsNeverOverlap(t *testing.T) {
	store := memstore.New()
	defer store.Close()
	l := newLedger()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	replicas(ctx, t, store, job.Every(100*time.Millisecond), map[string]time.Duration{"a": 0, "b": 30 * time.Millisecond},
		func(replica string) func(context.Context, job.Tick) error {
			return func(ctx context.Context, tk job.Tick) error {
				if n := l.inside.Add(1); n > l.max.Load() {
					l.max.Store(n)
				}
				defer l.inside.Add(-1)
				l.ran(replica, tk)
				time.Sleep(250 * time.Millisecond)
				return nil
			}
		}, job.WithTTL(100*time.Millisecond)).Wait()
	if m := l.max.Load(); m != 1 {
		t.Errorf("%d runs at once", m)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if n := len(l.runs); n < 4 || n > 10 {
		t.Errorf("%d ticks ran in 2 s of 250 ms runs every 100 ms", n)
	}
	for at, n := range l.runs {
		if n != 1 {
			t.Errorf("tick %s ran %d times", at, n)
		}
	}
}

// WithOverlap lets ticks run while an earlier one still goes, each once.
func TestOverlapWhenAsked(t *testing.T) {
	store := memstore.New()
	defer store.Close()
	l := newLedger()
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	replicas(ctx, t, store, job.Every(50*time.Millisecond), map[string]time.Duration{"a": 0},
		func(replica string) func(context.Context, job.Tick) error {
			return func(ctx context.Context, tk job.Tick) error {
				if n := l.inside.Add(1); n > l.max.Load() {
					l.max.Store(n)
				}
				defer l.inside.Add(-1)
				l.ran(replica, tk)
				time.Sleep(120 * time.Millisecond)
				return nil
			}
		}, job.WithOverlap()).Wait()
	if m := l.max.Load(); m < 2 {
		t.Errorf("at most %d runs at once WithOverlap", m)
	}
}

// A run that fails gives its tick back: a replica whose clock reaches the
// tick later runs it.
func TestFailedRunRunsOnAnotherReplica(t *testing.T) {
	store := memstore.New()
	defer store.Close()
	l := newLedger()
	var failures atomic.Int64
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	replicas(ctx, t, store, job.Every(200*time.Millisecond), map[string]time.Duration{"failing": 100 * time.Millisecond, "healthy": 0},
		func(replica string) func(context.Context, job.Tick) error {
			return func(ctx context.Context, tk job.Tick) error {
				if replica == "failing" {
					failures.Add(1)
					panic("the report's database is down")
				}
				l.ran(replica, tk)
				return nil
			}
		}, job.WithOnError(func(job.Tick, error) {})).Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	if failures.Load() < 3 || len(l.runs) < 3 {
		t.Fatalf("%d failures, %d ticks run", failures.Load(), len(l.runs))
	}
	for at, n := range l.runs {
		if n != 1 {
			t.Errorf("tick %s ran %d times on the healthy replica", at, n)
		}
	}
}

// WithCatchUp runs the latest tick missed while no replica ran, once.
func TestCatchUpRunsTheMissedTickOnce(t *testing.T) {
	store := memstore.New()
	defer store.Close()
	l := newLedger()
	for _, replica := range []string{"first", "second"} {
		ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
		_ = job.Run(ctx, store, "report", job.Every(time.Hour), func(ctx context.Context, tk job.Tick) error {
			l.ran(replica, tk)
			return nil
		}, job.WithCatchUp(time.Hour))
		cancel()
	}
	want := time.Now().UTC().Truncate(time.Hour)
	if len(l.runs) != 1 || l.runs[want] != 1 {
		t.Errorf("runs %v, want the tick of %s once", l.by, want)
	}
	// Without it, nothing runs until the next hour.
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	_ = job.Run(ctx, memstore.New(), "report", job.Every(time.Hour), func(ctx context.Context, tk job.Tick) error {
		t.Errorf("ran %s without WithCatchUp", tk.At)
		return nil
	})
}

// Bad arguments are refused with an error.
func TestRunRefusesBadArguments(t *testing.T) {
	store := memstore.New()
	defer store.Close()
	fn := func(context.Context, job.Tick) error { return nil }
	for name, err := range map[string]error{
		"no name":     job.Run(t.Context(), store, "", job.Every(time.Second), fn),
		"no schedule": job.Run(t.Context(), store, "x", nil, fn),
		"no function": job.Run(t.Context(), store, "x", job.Every(time.Second), nil),
		"negative":    job.Run(t.Context(), store, "x", job.Every(time.Second), fn, job.WithCatchUp(-time.Second)),
	} {
		if err == nil {
			t.Errorf("%s: nil error", name)
		}
	}
}

func TestEveryIsAlignedToTheEpoch(t *testing.T) {
	at := time.Date(2026, 11, 28, 15, 7, 30, 0, time.UTC)
	if got, want := job.Every(5*time.Minute).Next(at), time.Date(2026, 11, 28, 15, 10, 0, 0, time.UTC); !got.Equal(want) {
		t.Errorf("Next = %s, want %s", got, want)
	}
	if got := job.Every(5 * time.Minute).Next(time.Date(2026, 11, 28, 15, 10, 0, 0, time.UTC)); !got.Equal(time.Date(2026, 11, 28, 15, 15, 0, 0, time.UTC)) {
		t.Errorf("Next of a tick = %s, want the one after", got)
	}
}

// A robfig/cron schedule (here every second, with a seconds field) is a
// Schedule: three replicas with skewed clocks run each tick once.
func TestCronSchedule(t *testing.T) {
	sched, err := cron.NewParser(cron.Second | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow).Parse("* * * * * *")
	if err != nil {
		t.Fatal(err)
	}
	store := memstore.New()
	defer store.Close()
	l := newLedger()
	ctx, cancel := context.WithTimeout(t.Context(), 3500*time.Millisecond)
	defer cancel()
	replicas(ctx, t, store, sched, map[string]time.Duration{"late": -400 * time.Millisecond, "exact": 0, "early": 300 * time.Millisecond},
		func(replica string) func(context.Context, job.Tick) error {
			return func(ctx context.Context, tk job.Tick) error {
				l.ran(replica, tk)
				return nil
			}
		}).Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.runs) < 2 {
		t.Errorf("%d ticks in 3.5 s of a schedule every second", len(l.runs))
	}
	for at, n := range l.runs {
		if n != 1 || at.Nanosecond() != 0 {
			t.Errorf("tick %s ran %d times", at.Format("15:04:05.000"), n)
		}
	}
}

// A tick whose job's lock stays held past the tick after (and past the
// TTL) is skipped, and reported so.
func TestTickSkippedWhileTheLockIsHeld(t *testing.T) {
	store := memstore.New()
	defer store.Close()
	held, err := store.Acquire(t.Context(), job.LockKey("report"), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(context.Background())
	var skipped atomic.Int64
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	_ = job.Run(ctx, store, "report", job.Every(100*time.Millisecond), func(context.Context, job.Tick) error {
		t.Error("a tick ran while the job's lock was held")
		return nil
	}, job.WithTTL(50*time.Millisecond), job.WithOnError(func(_ job.Tick, err error) {
		if errors.Is(err, job.ErrSkipped) {
			skipped.Add(1)
		}
	}))
	if n := skipped.Load(); n < 3 {
		t.Errorf("%d ticks reported skipped in 1 s of 100 ms ticks", n)
	}
}
