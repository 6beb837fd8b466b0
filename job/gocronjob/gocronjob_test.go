package gocronjob_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/internal/teststores"
	"github.com/oncekit/oncekit/job/gocronjob"
	"github.com/oncekit/oncekit/lead"
	"github.com/oncekit/oncekit/storage/memstore"
	"github.com/oncekit/oncekit/storage/redisstore"
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

// runLog records when a job ran, on which scheduler.
type runLog struct {
	mu   sync.Mutex
	at   []time.Time
	by   []int
	done atomic.Bool
}

func (r *runLog) ran(i int) {
	if r.done.Load() {
		return
	}
	r.mu.Lock()
	r.at = append(r.at, time.Now())
	r.by = append(r.by, i)
	r.mu.Unlock()
}

// check says the runs after settle came one per period: never two within
// three quarters of a period, never a gap over a period and a quarter.
func (r *runLog) check(t *testing.T, period time.Duration, settle time.Time) {
	t.Helper()
	r.done.Store(true)
	r.mu.Lock()
	defer r.mu.Unlock()
	var at []time.Time
	var by []int
	for i, a := range r.at {
		if !a.Before(settle) {
			at, by = append(at, a), append(by, r.by[i])
		}
	}
	if len(at) < 4 {
		t.Fatalf("%d runs after %s", len(at), settle.Format("15:04:05.000"))
	}
	for i := 1; i < len(at); i++ {
		gap := at[i].Sub(at[i-1])
		if gap < period*3/4 {
			t.Errorf("runs %d (scheduler %d) and %d (scheduler %d) %s apart: the tick ran twice", i-1, by[i-1], i, by[i], gap.Round(time.Millisecond))
		}
		if gap > period+period/4 {
			t.Errorf("runs %d and %d %s apart: a tick ran nowhere", i-1, i, gap.Round(time.Millisecond))
		}
	}
	t.Logf("%d runs after settling, by %v", len(at), by)
}

// Three gocron schedulers on one Redis, each with a Locker and store of
// its own (as three processes have), at the Locker's defaults, started
// 0, 300 and 700 ms apart: a one-second DurationJob (whose ticks follow
// each scheduler's own start) and an every-second CronJob run once per
// second — no second with no run, none with two.
func TestDefaultsRunEachTickOnceAcrossStaggeredSchedulers(t *testing.T) {
	addr := testenv.RedisAddrs(t, 1)[0]
	for _, kind := range []string{"duration", "cron"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			name := teststores.Name("report-" + kind)
			var log runLog
			begin := time.Now()
			for i, stagger := range []time.Duration{0, 300 * time.Millisecond, 700 * time.Millisecond} {
				time.Sleep(time.Until(begin.Add(stagger)))
				c := redis.NewClient(&redis.Options{Addr: addr})
				defer c.Close()
				store, err := redisstore.New(c)
				if err != nil {
					t.Fatal(err)
				}
				defer store.Close()
				l, err := gocronjob.NewLocker(store)
				if err != nil {
					t.Fatal(err)
				}
				s, err := gocron.NewScheduler(gocron.WithDistributedLocker(l))
				if err != nil {
					t.Fatal(err)
				}
				def := gocron.JobDefinition(gocron.DurationJob(time.Second))
				if kind == "cron" {
					def = gocron.CronJob("* * * * * *", true)
				}
				if _, err := s.NewJob(def, gocron.NewTask(func() { log.ran(i) }), gocron.WithName(name)); err != nil {
					t.Fatal(err)
				}
				s.Start()
				defer func() { _ = s.Shutdown() }()
			}
			time.Sleep(time.Until(begin.Add(9 * time.Second)))
			log.check(t, time.Second, begin.Add(2500*time.Millisecond))
		})
	}
}

// On every store configuration, fenced or not: three schedulers, each with
// a Locker of its own, run an every-second CronJob once per second at the
// Locker's defaults.
func TestEveryStore(t *testing.T) {
	teststores.Each(t, func(t *testing.T, c teststores.Config) {
		t.Parallel()
		name := teststores.Name("report")
		store := c.Open(t)
		var log runLog
		begin := time.Now()
		for i := range 3 {
			l, err := gocronjob.NewLocker(store)
			if err != nil {
				t.Fatal(err)
			}
			s, err := gocron.NewScheduler(gocron.WithDistributedLocker(l))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.NewJob(gocron.CronJob("* * * * * *", true), gocron.NewTask(func() { log.ran(i) }), gocron.WithName(name)); err != nil {
				t.Fatal(err)
			}
			s.Start()
			defer func() { _ = s.Shutdown() }()
		}
		time.Sleep(time.Until(begin.Add(6500 * time.Millisecond)))
		log.check(t, time.Second, begin.Add(1500*time.Millisecond))
	})
}

// lead.Elector is go-co-op/gocron v2's Elector: of two schedulers that share a
// store, only the leader's runs its jobs.
func TestGocronElector(t *testing.T) {
	store := memstore.New()
	defer store.Close()
	var runs [2]atomic.Int64
	for i := range 2 {
		e, err := lead.NewElector(t.Context(), store, "gocron", lead.WithTTL(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		s, err := gocron.NewScheduler(gocron.WithDistributedElector(e))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.NewJob(gocron.DurationJob(50*time.Millisecond), gocron.NewTask(func() { runs[i].Add(1) })); err != nil {
			t.Fatal(err)
		}
		s.Start()
		defer func() { _ = s.Shutdown() }()
	}
	time.Sleep(time.Second)
	a, b := runs[0].Load(), runs[1].Load()
	if (a == 0) == (b == 0) || a+b < 5 {
		t.Errorf("the schedulers ran %d and %d jobs: want one of them only, several times", a, b)
	}
}
