package lead_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/internal/teststores"
	"github.com/oncekit/oncekit/lead"
	"github.com/oncekit/oncekit/storage/memstore"
)

// Three replicas: one leads at a time, each leader's fence above the
// last, and when a leader stops (its loop returns or its replica shuts
// down) another takes over.
func TestOneLeaderAtATime(t *testing.T) {
	store := memstore.New()
	defer store.Close()
	var (
		inside, most atomic.Int64
		mu           sync.Mutex
		fences       []uint64
		leaders      = map[string]int{}
	)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for _, name := range []string{"a", "b", "c"} {
		rctx, stop := context.WithCancel(ctx)
		defer stop()
		wg.Go(func() {
			err := lead.Run(rctx, store, "outbox-relay", func(ctx context.Context, l lock.Lease) error {
				n := inside.Add(1)
				defer inside.Add(-1)
				if n > most.Load() {
					most.Store(n)
				}
				mu.Lock()
				fences = append(fences, l.Fence())
				leaders[name]++
				turn := leaders[name]
				mu.Unlock()
				if name == "a" && turn == 2 {
					stop() // replica a shuts down while it leads
				}
				select { // lead for a while, then hand over
				case <-ctx.Done():
				case <-time.After(100 * time.Millisecond):
				}
				return nil
			}, lead.WithTTL(time.Second), lead.WithRetryDelay(20*time.Millisecond))
			if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("replica %s: Run returned %v", name, err)
			}
		})
	}
	wg.Wait()
	if most.Load() != 1 {
		t.Errorf("%d leaders at once", most.Load())
	}
	mu.Lock()
	defer mu.Unlock()
	if len(fences) < 8 {
		t.Errorf("%d terms in 3 s of 100 ms terms", len(fences))
	}
	for i := 1; i < len(fences); i++ {
		if fences[i] <= fences[i-1] {
			t.Errorf("term %d's fence %d is not above the last, %d", i, fences[i], fences[i-1])
		}
	}
	if leaders["a"] != 2 {
		t.Errorf("replica a led %d times after it shut down on its second term", leaders["a"])
	}
}

// A loop that fails or panics is reported, and the replicas compete again.
func TestFailingLoopIsReportedAndRetried(t *testing.T) {
	store := memstore.New()
	defer store.Close()
	var errs, calls atomic.Int64
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	_ = lead.Run(ctx, store, "relay", func(ctx context.Context, l lock.Lease) error {
		if calls.Add(1)%2 == 0 {
			panic("relay bug")
		}
		return errors.New("broker down")
	}, lead.WithRetryDelay(20*time.Millisecond), lead.WithOnError(func(error) { errs.Add(1) }))
	if calls.Load() < 4 || errs.Load() != calls.Load() {
		t.Errorf("%d calls, %d errors reported", calls.Load(), errs.Load())
	}
}

// A replica shut down while it waits for the key, or while its loop
// returns the context's error, reports no error: shutting down is not a
// failure.
func TestShutdownIsNotAnError(t *testing.T) {
	store := memstore.New()
	defer store.Close()
	held, err := store.Acquire(t.Context(), "relay", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(context.Background())
	var errs atomic.Int64
	onErr := lead.WithOnError(func(error) { errs.Add(1) })
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	if err := lead.Run(ctx, store, "relay", func(context.Context, lock.Lease) error { return nil }, onErr); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("waiting replica: Run = %v", err)
	}
	ctx2, cancel2 := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel2()
	if err := lead.Run(ctx2, store, "other", func(ctx context.Context, _ lock.Lease) error { <-ctx.Done(); return ctx.Err() }, onErr); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("leading replica: Run = %v", err)
	}
	if errs.Load() != 0 {
		t.Errorf("%d errors reported for a shutdown", errs.Load())
	}
}

// One of three Electors leads; when its campaign ends, another leads.
func TestElector(t *testing.T) {
	store := memstore.New()
	defer store.Close()
	var electors []*lead.Elector
	var stops []context.CancelFunc
	for range 3 {
		ctx, stop := context.WithCancel(t.Context())
		defer stop()
		e, err := lead.NewElector(ctx, store, "scheduler", lead.WithTTL(time.Second), lead.WithRetryDelay(20*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		electors, stops = append(electors, e), append(stops, stop)
	}
	leader := func() int {
		t.Helper()
		for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			var who []int
			for i, e := range electors {
				if e.IsLeader(t.Context()) == nil {
					who = append(who, i)
				}
			}
			if len(who) > 1 {
				t.Fatalf("electors %v lead at once", who)
			}
			if len(who) == 1 {
				return who[0]
			}
		}
		t.Fatal("no elector leads")
		return -1
	}
	first := leader()
	if electors[first].Fence() == 0 {
		t.Error("the leader has no fence")
	}
	stops[first]()
	<-electors[first].Done()
	if electors[first].IsLeader(t.Context()) == nil {
		t.Error("an elector whose campaign ended still leads")
	}
	if next := leader(); next == first {
		t.Error("the stopped elector leads again")
	}
}

func TestBadArguments(t *testing.T) {
	store := memstore.New()
	defer store.Close()
	fn := func(context.Context, lock.Lease) error { return nil }
	for name, err := range map[string]error{
		"no locker": lead.Run(t.Context(), nil, "k", fn),
		"no key":    lead.Run(t.Context(), store, "", fn),
		"no fn":     lead.Run(t.Context(), store, "k", nil),
		"no delay":  lead.Run(t.Context(), store, "k", fn, lead.WithRetryDelay(0)),
	} {
		if err == nil {
			t.Errorf("%s: nil error", name)
		}
	}
	if _, err := lead.NewElector(t.Context(), store, ""); err == nil {
		t.Error("NewElector with no key: nil error")
	}
}

// On every store configuration, fenced or not, one of two Electors leads
// (and answers a fence only where the store issues them), a loop of Run
// leads, and when the leader's campaign ends the other takes over.
func TestEveryStore(t *testing.T) {
	teststores.Each(t, func(t *testing.T, c teststores.Config) {
		t.Parallel()
		store := c.Open(t)
		key := teststores.Name("elector")
		var electors [2]*lead.Elector
		var stops [2]context.CancelFunc
		for i := range electors {
			ctx, stop := context.WithCancel(t.Context())
			defer stop()
			e, err := lead.NewElector(ctx, store, key, lead.WithTTL(time.Second), lead.WithRetryDelay(20*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			electors[i], stops[i] = e, stop
		}
		leader := func() int {
			t.Helper()
			for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
				a, b := electors[0].IsLeader(t.Context()) == nil, electors[1].IsLeader(t.Context()) == nil
				switch {
				case a && b:
					t.Fatal("both electors lead")
				case a:
					return 0
				case b:
					return 1
				}
			}
			t.Fatal("no elector leads")
			return -1
		}
		first := leader()
		if fenced := electors[first].Fence() != 0; fenced != c.Fenced {
			t.Errorf("the leader's fence is %d on a store whose leases are fenced: %v", electors[first].Fence(), c.Fenced)
		}
		stops[first]()
		<-electors[first].Done()
		if next := leader(); next == first {
			t.Error("the stopped elector leads again")
		}

		ran := make(chan lock.Lease, 1)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go func() {
			_ = lead.Run(ctx, store, teststores.Name("loop"), func(ctx context.Context, l lock.Lease) error {
				ran <- l
				<-ctx.Done()
				return nil
			}, lead.WithTTL(time.Second))
		}()
		select {
		case l := <-ran:
			if (l.Fence() != 0) != c.Fenced {
				t.Errorf("the loop's lease has fence %d (fenced store: %v)", l.Fence(), c.Fenced)
			}
		case <-time.After(5 * time.Second):
			t.Error("Run's loop did not lead within 5 s")
		}
	})
}
