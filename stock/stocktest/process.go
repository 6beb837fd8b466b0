package stocktest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/oncekit/oncekit/internal/childproc"
	"github.com/oncekit/oncekit/stock"
	"github.com/oncekit/oncekit/stock/stockdriver"
)

// The worker process: the killed cases start the test binary again with
// these variables set; the driver's TestMain calls RunWorker, which takes
// or holds units of the item and waits to be killed.
const (
	workerItemEnv = "ONCEKIT_STOCKTEST_ITEM"
	workerModeEnv = "ONCEKIT_STOCKTEST_MODE" // "take" or "hold"
	workerNameEnv = "ONCEKIT_STOCKTEST_NAME" // the worker's keys start with it
)

// The killed cases' numbers.
const (
	takers    = 4                       // goroutines taking in each worker
	holds     = 5                       // holds a holding worker makes
	holdTTL   = 1500 * time.Millisecond // how long they last
	takeUnits = 1 << 30                 // never sold out while the workers take
)

// RunWorker is for a driver's TestMain. In the worker process that the
// suite's killed cases start, it takes or holds units of the item the suite
// names with a store from newStore, says so on stdout and goes on until it
// is killed; it never returns there. In any other process it returns at
// once.
//
//	func TestMain(m *testing.M) {
//		stocktest.RunWorker(func() (stockdriver.Store, error) { return redisstore.New(client()) })
//		os.Exit(m.Run())
//	}
func RunWorker(newStore func() (stockdriver.Store, error)) {
	it := os.Getenv(workerItemEnv)
	if it == "" {
		return
	}
	err := work(newStore, it, os.Getenv(workerModeEnv), os.Getenv(workerNameEnv))
	fmt.Println("error:", err)
	os.Exit(3)
}

func work(newStore func() (stockdriver.Store, error), it, mode, name string) error {
	store, err := newStore()
	if err != nil {
		return err
	}
	st, err := stock.New(store)
	if err != nil {
		return err
	}
	ctx := context.Background()
	if mode == "hold" {
		for i := range holds {
			if _, err := st.Hold(ctx, it, name+"/"+strconv.Itoa(i), 1, holdTTL); err != nil {
				return err
			}
		}
		fmt.Println("held")
		select {} // until killed
	}
	errs := make(chan error, takers)
	var once sync.Once
	for g := range takers {
		go func() {
			for i := 0; ; i++ {
				if _, err := st.Take(ctx, it, takeKey(name, g, i), 1); err != nil {
					errs <- err
					return
				}
				once.Do(func() { fmt.Println("taking") })
			}
		}()
	}
	return <-errs
}

// takeKey is the key of a worker's taker g's i-th take: each taker takes
// its keys in order, so the keys a killed worker took are a prefix of
// each taker's, and at most its last one was in flight.
func takeKey(name string, g, i int) string {
	return name + "/" + strconv.Itoa(g) + "/" + strconv.Itoa(i)
}

func (s *suite) start(t *testing.T, it, mode, name, ready string) *childproc.Child {
	env := append(append([]string{}, s.cfg.ProcessEnv...), workerItemEnv+"="+it, workerModeEnv+"="+mode, workerNameEnv+"="+name)
	return childproc.Start(t, env, ready, 20*time.Second)
}

// killedMidTake: two worker processes take units as fast as they can and
// are killed with SIGKILL mid-stream. Afterwards every unit is accounted
// for: what the item says was sold is exactly the takes whose keys answer
// as sold — each killed take either happened, and a retry finds it, or did
// not, and a retry makes it — and nothing is held.
func (s *suite) killedMidTake(t *testing.T) {
	if !s.cfg.Process {
		return // an in-process store, or a configuration whose workers the driver's TestMain cannot build
	}
	st := s.stock(t)
	ctx := ctxTimeout(t, 60*time.Second)
	it := item(t)
	put(t, st, it, takeUnits)
	workers := []*childproc.Child{s.start(t, it, "take", "w0", "taking"), s.start(t, it, "take", "w1", "taking")}
	for level(t, st, it).Sold < 40 {
		time.Sleep(5 * time.Millisecond)
	}
	for _, w := range workers {
		if err := w.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = w.Wait()
	}
	time.Sleep(100 * time.Millisecond) // a request a worker sent before it died may still land
	before := level(t, st, it)
	// Retry every taker's keys in order: the ones the workers took answer
	// replayed; the first that does not was not taken (the retry takes it
	// now, as a client's retry would) and ends the taker's keys.
	var replayed, retaken int64
	for _, w := range []string{"w0", "w1"} {
		for g := range takers {
			for i := 0; ; i++ {
				sale, err := st.Take(ctx, it, takeKey(w, g, i), 1)
				if err != nil {
					t.Fatalf("retried take %s: %v", takeKey(w, g, i), err)
				}
				if !sale.Replayed {
					retaken++
					break
				}
				replayed++
			}
		}
	}
	after := level(t, st, it)
	t.Logf("killed mid-take: %d takes done by the workers, %d retried anew", replayed, retaken)
	if before.Sold != replayed || before.Held != 0 {
		t.Fatalf("after the kill the item says %d sold and %d held, but %d keys answer sold", before.Sold, before.Held, replayed)
	}
	if after.Sold != replayed+retaken || after.Put != takeUnits {
		t.Fatalf("after the retries: %+v, want %d sold of %d", after, replayed+retaken, int64(takeUnits))
	}
}

// killedMidHold: a worker process holds units and is killed with SIGKILL:
// its holds run out by the store's clock, their units are free again
// exactly once, and confirming one afterwards fails with ErrHoldExpired.
func (s *suite) killedMidHold(t *testing.T) {
	if !s.cfg.Process {
		return // an in-process store, or a configuration whose workers the driver's TestMain cannot build
	}
	st := s.stock(t)
	ctx := ctxTimeout(t, 60*time.Second)
	it := item(t)
	put(t, st, it, holds+2)
	w := s.start(t, it, "hold", "w", "held")
	if err := w.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = w.Wait()
	killed := time.Now()
	if l := level(t, st, it); l.Held != holds && time.Since(killed) < holdTTL/2 {
		t.Fatalf("right after the kill: %+v, want %d held", l, holds)
	}
	deadline := killed.Add(holdTTL + s.cfg.Lag + 2*time.Second)
	for {
		l := level(t, st, it)
		if l.Held == 0 {
			if l != (stock.Level{Put: holds + 2, Free: holds + 2}) {
				t.Fatalf("after the holds ran out: %+v, want all %d free", l, holds+2)
			}
			t.Logf("the killed holder's units were free %v after the kill (TTL %v)", time.Since(killed).Round(time.Millisecond), holdTTL)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v after the kill the item still holds %d units (TTL %v)", time.Since(killed), l.Held, holdTTL)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for i := range holds {
		if _, err := st.Confirm(ctx, it, "w/"+strconv.Itoa(i)); !errors.Is(err, stock.ErrHoldExpired) {
			t.Fatalf("Confirm of the killed holder's hold: %v, want ErrHoldExpired", err)
		}
	}
	wantLevel(t, st, it, stock.Level{Put: holds + 2, Free: holds + 2})
}
