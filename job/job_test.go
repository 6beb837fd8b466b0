package job_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	_ "time/tzdata"

	"github.com/robfig/cron/v3"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/internal/teststores"
	"github.com/oncekit/oncekit/job"
	"github.com/oncekit/oncekit/storage"
	"github.com/oncekit/oncekit/storage/memstore"
	"github.com/oncekit/oncekit/storage/sqlstore"
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

// accounting records, per tick, the runs and the ErrSkipped reports of a
// job.
type accounting struct {
	mu           sync.Mutex
	runs, skips  map[time.Time]int
	firstRun     time.Time
	inside, most atomic.Int64
	otherErrs    []error
}

func newAccounting() *accounting {
	return &accounting{runs: map[time.Time]int{}, skips: map[time.Time]int{}}
}

func (a *accounting) onError(t job.Tick, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if errors.Is(err, job.ErrSkipped) {
		a.skips[t.At]++
		return
	}
	a.otherErrs = append(a.otherErrs, err)
}

// check says every tick of period from the first run until cutoff ran
// once or was reported skipped once, never both.
func (a *accounting) check(t *testing.T, period time.Duration, cutoff time.Time) (ran, skipped int) {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.firstRun.IsZero() {
		t.Fatal("no tick ran")
	}
	for _, err := range a.otherErrs {
		t.Errorf("error reported: %v", err)
	}
	if m := a.most.Load(); m > 1 {
		t.Errorf("%d runs at once", m)
	}
	for at := a.firstRun; at.Before(cutoff); at = at.Add(period) {
		r, s := a.runs[at], a.skips[at]
		if r+s != 1 {
			t.Errorf("tick %s: %d runs, %d reported skipped; want exactly one of them", at.Format("15:04:05.000"), r, s)
		}
		ran += r
		skipped += s
	}
	return ran, skipped
}

// Three replicas, a tick every 400 ms, a TTL of 100 ms, and a first run
// longer than the period: the tick that came while it ran waits for the
// lock (free before the tick after it) and runs; no tick is dropped
// unreported.
func TestLongRunDoesNotDropTheNextTick(t *testing.T) {
	for _, long := range []time.Duration{450 * time.Millisecond, 600 * time.Millisecond, 900 * time.Millisecond} {
		t.Run(long.String(), func(t *testing.T) {
			t.Parallel()
			store := memstore.New()
			defer store.Close()
			a := newAccounting()
			period := 400 * time.Millisecond
			ctx, cancel := context.WithTimeout(t.Context(), 3200*time.Millisecond)
			defer cancel()
			var first atomic.Bool
			replicas(ctx, t, store, job.Every(period), map[string]time.Duration{"a": 0, "b": 0, "c": 0},
				func(replica string) func(context.Context, job.Tick) error {
					return func(ctx context.Context, tk job.Tick) error {
						if n := a.inside.Add(1); n > a.most.Load() {
							a.most.Store(n)
						}
						defer a.inside.Add(-1)
						a.mu.Lock()
						a.runs[tk.At]++
						if a.firstRun.IsZero() {
							a.firstRun = tk.At
						}
						a.mu.Unlock()
						if first.CompareAndSwap(false, true) {
							time.Sleep(long)
						}
						return nil
					}
				}, job.WithTTL(100*time.Millisecond), job.WithOnError(a.onError)).Wait()
			ran, skipped := a.check(t, period, time.Now().Add(-2*period))
			a.mu.Lock()
			second := a.runs[a.firstRun.Add(period)]
			a.mu.Unlock()
			if long < 2*period && second != 1 {
				t.Errorf("the tick after a %s run ran %d times; the lock was free before the tick after it", long, second)
			}
			t.Logf("%s first run: %d ticks ran, %d skipped", long, ran, skipped)
		})
	}
}

// fastClock is a clock that runs speed times faster than the real one,
// from start, in loc.
func fastClock(start time.Time, speed float64, loc *time.Location) func() time.Time {
	t0 := time.Now()
	return func() time.Time {
		return start.Add(time.Duration(float64(time.Since(t0)) * speed)).In(loc)
	}
}

func mustLoad(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name) // time/tzdata is linked in: never missing
	if err != nil {
		t.Fatalf("time zone %s: %v", name, err)
	}
	return loc
}

// A tick is an instant every replica agrees on, whatever their zones: a
// cron schedule runs by UTC's clock unless it names its zone, so replicas
// in UTC, Asia/Kolkata and America/New_York run "0 3 * * *" once a day at
// 03:00 UTC, and New York's daylight-saving days neither run a tick twice
// nor skip one. A schedule that names its zone (CRON_TZ=) runs by it.
func TestCronTicksAreInstantsAcrossZones(t *testing.T) {
	utc, kolkata, newYork := time.UTC, mustLoad(t, "Asia/Kolkata"), mustLoad(t, "America/New_York")
	for _, tc := range []struct {
		name, spec string
		start      time.Time // UTC
		want       []string  // the ticks that run, UTC
	}{
		{"mixed zones", "0 3 * * *", time.Date(2026, 12, 5, 2, 0, 0, 0, utc),
			[]string{"2026-12-05T03:00:00Z", "2026-12-06T03:00:00Z"}},
		{"fall back", "30 1 * * *", time.Date(2026, 11, 1, 0, 0, 0, 0, utc),
			[]string{"2026-11-01T01:30:00Z", "2026-11-02T01:30:00Z"}},
		{"spring forward", "30 2 * * *", time.Date(2026, 3, 8, 1, 0, 0, 0, utc),
			[]string{"2026-03-08T02:30:00Z", "2026-03-09T02:30:00Z"}},
		{"named zone", "CRON_TZ=Asia/Kolkata 0 3 * * *", time.Date(2026, 12, 5, 20, 0, 0, 0, utc),
			[]string{"2026-12-05T21:30:00Z", "2026-12-06T21:30:00Z"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			sched, err := cron.ParseStandard(tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			store := memstore.New()
			defer store.Close()
			var mu sync.Mutex
			runs := map[string]int{}
			// 10 hours a second: 3.2 s cover 32 hours.
			ctx, cancel := context.WithTimeout(t.Context(), 3200*time.Millisecond)
			defer cancel()
			var wg sync.WaitGroup
			for _, loc := range []*time.Location{utc, kolkata, newYork} {
				wg.Go(func() {
					_ = job.Run(ctx, store, "report", sched, func(_ context.Context, tk job.Tick) error {
						mu.Lock()
						runs[tk.At.Format(time.RFC3339)]++
						mu.Unlock()
						return nil
					}, job.WithClock(fastClock(tc.start, 36000, loc)))
				})
			}
			wg.Wait()
			mu.Lock()
			defer mu.Unlock()
			for _, at := range tc.want {
				if runs[at] != 1 {
					t.Errorf("tick %s ran %d times, want once", at, runs[at])
				}
			}
			if len(runs) != len(tc.want) {
				t.Errorf("ticks run: %v, want %v", runs, tc.want)
			}
		})
	}
}

// Schedules and options that cannot work are refused with an error, not
// accepted to tick never (or wrongly).
func TestRunRefusesSchedulesThatCannotTick(t *testing.T) {
	store := memstore.New()
	defer store.Close()
	fn := func(context.Context, job.Tick) error { t.Error("ran"); return nil }
	never, err := cron.ParseStandard("0 0 30 2 *") // 30 February
	if err != nil {
		t.Fatal(err)
	}
	for name, run := range map[string]func() error{
		"Every(0)":     func() error { return job.Run(t.Context(), store, "x", job.Every(0), fn) },
		"Every(-1s)":   func() error { return job.Run(t.Context(), store, "x", job.Every(-time.Second), fn) },
		"Every(1µs)":   func() error { return job.Run(t.Context(), store, "x", job.Every(time.Microsecond), fn) },
		"no tick ever": func() error { return job.Run(t.Context(), store, "x", never, fn) },
		"retention under catch-up": func() error {
			return job.Run(t.Context(), store, "x", job.Every(time.Hour), fn, job.WithCatchUp(time.Hour), job.WithRetention(time.Minute))
		},
		"zero TTL": func() error { return job.Run(t.Context(), store, "x", job.Every(time.Hour), fn, job.WithTTL(0)) },
	} {
		done := make(chan error, 1)
		go func() { done <- run() }()
		select {
		case err := <-done:
			if err == nil || errors.Is(err, context.Canceled) {
				t.Errorf("%s: Run returned %v, want an error that says why", name, err)
			}
		case <-time.After(2 * time.Second):
			t.Errorf("%s: Run still running after 2 s", name)
		}
	}
}

// Catch-up finds the latest missed tick however many ticks the window
// holds (here 7.2 million of 1 ms), not an old one.
func TestCatchUpRunsTheLatestTickOfALongWindow(t *testing.T) {
	store := memstore.New()
	defer store.Close()
	start := time.Now()
	first := make(chan time.Time, 1)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() {
		_ = job.Run(ctx, store, "report", job.Every(time.Millisecond), func(_ context.Context, tk job.Tick) error {
			select {
			case first <- tk.At:
			default:
			}
			return nil
		}, job.WithCatchUp(2*time.Hour))
	}()
	select {
	case at := <-first:
		if at.Before(start.Add(-time.Second)) {
			t.Errorf("the caught-up tick is %s, %s before the start: not the latest", at.Format(time.RFC3339Nano), start.Sub(at))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no tick ran")
	}
}

// On every store configuration, fenced or not: three replicas run each
// tick once (a fence on each run where the store issues fences), the
// tick after a run longer than the period runs when the lock frees, and
// no tick is dropped unreported.
func TestEveryStore(t *testing.T) {
	teststores.Each(t, func(t *testing.T, c teststores.Config) {
		t.Parallel()
		store := c.Open(t)
		name := teststores.Name("report")
		a := newAccounting()
		period := 400 * time.Millisecond
		ctx, cancel := context.WithTimeout(t.Context(), 3200*time.Millisecond)
		defer cancel()
		var first atomic.Bool
		var wg sync.WaitGroup
		for range 3 {
			wg.Go(func() {
				_ = job.Run(ctx, store, name, job.Every(period), func(ctx context.Context, tk job.Tick) error {
					if n := a.inside.Add(1); n > a.most.Load() {
						a.most.Store(n)
					}
					defer a.inside.Add(-1)
					if (tk.Fence != 0) != c.Fenced {
						t.Errorf("tick %s: fence %d on a store whose leases are fenced: %v", tk.At, tk.Fence, c.Fenced)
					}
					a.mu.Lock()
					a.runs[tk.At]++
					if a.firstRun.IsZero() {
						a.firstRun = tk.At
					}
					a.mu.Unlock()
					if first.CompareAndSwap(false, true) {
						time.Sleep(period + period/4)
					}
					return nil
				}, job.WithTTL(300*time.Millisecond), job.WithOnError(a.onError))
			})
		}
		wg.Wait()
		a.check(t, period, time.Now().Add(-2*period))
		a.mu.Lock()
		defer a.mu.Unlock()
		if n := a.runs[a.firstRun.Add(period)]; n != 1 {
			t.Errorf("the tick after the long run ran %d times", n)
		}
	})
}

// A job's run answers when it returns, as a middleware's does: an effect
// that the caller's own transaction commits (sqlstore.InTx) is refused,
// since the tick's record would stay in flight and another replica would
// run the tick again.
func TestCallerCommittedEffectIsRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		url  func(testing.TB) string
	}{{"postgres", testenv.PostgresURL}, {"mysql", testenv.MySQLURL}} {
		t.Run(tc.name, func(t *testing.T) {
			url := tc.url(t)
			st, err := storage.Open(t.Context(), url)
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			db, err := sqlstore.OpenDB(url)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			got := make(chan error, 1)
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			go func() {
				_ = job.Run(ctx, st, teststores.Name("intx"), job.Every(100*time.Millisecond), func(ctx context.Context, _ job.Tick) error {
					tx, err := db.BeginTx(ctx, nil)
					if err != nil {
						got <- err
						return err
					}
					defer tx.Rollback()
					err = idem.Commit(ctx, sqlstore.InTx(tx))
					select {
					case got <- err:
					default:
					}
					return err
				}, job.WithOnError(func(job.Tick, error) {}))
			}()
			select {
			case err := <-got:
				if !errors.Is(err, idem.ErrCallerCommits) {
					t.Errorf("Commit(InTx) in a job's run = %v, want idem.ErrCallerCommits", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("no tick ran")
			}
		})
	}
}
