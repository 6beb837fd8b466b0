package redlockstore_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/storage/internal/rediskit"
	"github.com/oncekit/oncekit/storage/redlockstore"
)

// A Store that takes a key again right after letting it go keeps its next
// Release's hold: its next Acquire takes the key with no round, the same
// token and the next fence (fenced) or 0 (unfenced), up to
// WithMaxLocalHandOffs times. Then the key is released, and another
// process waiting for it gets it, with a fence above all of them.
func TestHotKeyKeptForNextAcquire(t *testing.T) {
	addrs := testenv.RedisAddrs(t, 5)[:5]
	for _, mode := range []struct {
		name string
		opts []redlockstore.Option
	}{{"fenced", nil}, {"unfenced", []redlockstore.Option{redlockstore.WithoutFencing()}}} {
		t.Run(mode.name, func(t *testing.T) {
			var rt counter
			a := newStore(t, clients(t, addrs, &rt), append(mode.opts, redlockstore.WithLinger(time.Hour), redlockstore.WithMaxLocalHold(0), redlockstore.WithMaxLocalHandOffs(4))...)
			b := newStore(t, clients(t, addrs), mode.opts...)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			key := "kept-" + mode.name + time.Now().Format("150405.000000")
			testenv.AcquireRelease(ctx, t, a, key, 10*time.Second) // cold: released on the nodes
			// Taken again at once: hot, kept (another Store cannot take it).
			last := testenv.HeatUp(ctx, t, a, key, 10*time.Second, func(lock.Lease) bool {
				l, err := b.TryAcquire(ctx, key, time.Second)
				if err == nil {
					l.Release(ctx)
				}
				return err != nil
			})

			got := testenv.AcquireLater(ctx, t, b, key, 10*time.Second)
			time.Sleep(100 * time.Millisecond) // b queued on the nodes
			before := rt.N.Load()
			last = testenv.KeptCycles(ctx, t, a, key, last, 4, mode.name == "fenced")
			// The last Release is a round to every node; it returns once a
			// majority answered, the rest may still be on their way.
			if n := rt.N.Load() - before; n < 3 || n > 5 {
				t.Errorf("4 kept leases and the release after them made %d requests, want 3 to 5 (the release round)", n)
			}
			l := <-got
			if l == nil {
				return
			}
			defer l.Release(context.Background())
			if mode.name == "fenced" && l.Fence() <= last.Fence() {
				t.Errorf("the waiting process got fence %d after the Store's local fence %d", l.Fence(), last.Fence())
			}
		})
	}
}

// A Refresh still in flight when its lease is released (and its hold kept
// for the Store's next Acquire) must not release the hold when its replies
// come: the hold is the next lease's now.
func TestLateRefreshSparesKeptHold(t *testing.T) {
	addrs := testenv.RedisAddrs(t, 5)[:5]
	slow := testenv.SlowScript{SHA: rediskit.Refresh.Hash(), Delay: 300 * time.Millisecond}
	a := newStore(t, clients(t, addrs, slow), redlockstore.WithLinger(time.Hour), redlockstore.WithMaxLocalHold(time.Hour))
	b := newStore(t, clients(t, addrs))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	key := "late-refresh-" + time.Now().Format("150405.000000")
	l := testenv.FromKept(ctx, t, a, key, 10*time.Second)
	testenv.RefreshAcrossRelease(ctx, t, l)
	time.Sleep(50 * time.Millisecond) // the refresh's clean-up, if any, has run
	if got, err := b.TryAcquire(ctx, key, time.Second); err == nil {
		got.Release(ctx)
		t.Fatal("the late Refresh's clean-up released the kept hold")
	}
	next, err := a.Acquire(ctx, key, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer next.Release(ctx)
	if next.Token() != l.Token() {
		t.Errorf("the kept hold did not serve the next Acquire")
	}
}

// Many goroutines of one Store on one key, for more cycles than one hold
// serves leases (keep.ReservedFences): the key passes through kept holds
// and rounds on the nodes, and every lease is exclusive, fenced above the
// one before, and released without being found lost. (A late answer to an
// earlier round of the winning wait used to give back a node of a hold the
// Store had kept, taking the live hold below a majority: another process
// could then take the key.)
func TestManyGoroutinesOneKey(t *testing.T) {
	addrs := testenv.RedisAddrs(t, 5)[:5]
	cs := make([]redlockstore.Client, len(addrs))
	for i, a := range addrs { // go-redis' defaults: deadlines kept by oncekit
		c := redis.NewClient(&redis.Options{Addr: a, PoolSize: 64})
		t.Cleanup(func() { c.Close() })
		cs[i] = c
	}
	s := newStore(t, cs)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	key := "many-" + time.Now().Format("150405.000000")
	const workers, cycles = 16, 30000
	var (
		next      atomic.Int64
		inside    atomic.Int32
		mu        sync.Mutex
		lastFence uint64
		wg        sync.WaitGroup
	)
	errs := make(chan error, workers)
	for range workers {
		wg.Go(func() {
			for next.Add(1) <= cycles {
				l, err := s.Acquire(ctx, key, 10*time.Second)
				if err != nil {
					errs <- err
					return
				}
				if n := inside.Add(1); n != 1 {
					errs <- fmt.Errorf("%d holders at once", n)
				}
				mu.Lock()
				if l.Fence() <= lastFence {
					errs <- fmt.Errorf("fence %d after %d", l.Fence(), lastFence)
				}
				lastFence = l.Fence()
				mu.Unlock()
				inside.Add(-1)
				if err := l.Release(ctx); err != nil {
					errs <- fmt.Errorf("release of fence %d: %w", l.Fence(), err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
