package sqlstore_test

import (
	"context"
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/observe"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/storage/sqlstore"
)

// handOffDatabases are the servers the hand-off tests run on: the two
// dialects, and PostgreSQL behind pgbouncer (no session locks: waiters
// queue in the table).
func handOffDatabases(t *testing.T) map[string]string {
	dbs := databases(t)
	if os.Getenv("PGBOUNCER_URL") != "" || testenv.Required() {
		dbs["postgres-pgbouncer"] = withParam(testenv.PgBouncerURL(t), "notify=false&default_query_exec_mode=exec")
	}
	return dbs
}

// heldWithAWaiter takes key on s, then starts a second Acquire of it on
// s (for ttl), which waits in the Store: its lease comes on the channel.
func heldWithAWaiter(ctx context.Context, t *testing.T, s *sqlstore.Store, key string, ttl time.Duration) (lock.Lease, <-chan lock.Lease) {
	t.Helper()
	first, err := s.Acquire(ctx, key, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	got := testenv.AcquireLater(ctx, t, s, key, ttl)
	time.Sleep(100 * time.Millisecond) // the second waits in the Store
	return first, got
}

func localHandOffs(ev *testenv.Events) int {
	n := 0
	for _, e := range ev.Of(observe.LockHandOff) {
		if e.Outcome == observe.Local {
			n++
		}
	}
	return n
}

// Goroutines of one Store taking one key in turn: one holder at a time,
// each lease's fence above the one before, most leases handed from
// lease to lease inside the Store — and a fence issued later, to another
// process, above them all. With hand-offs turned off, none is handed on.
func TestLocalHandOffs(t *testing.T) {
	for name, url := range handOffDatabases(t) {
		for _, mode := range []struct {
			name string
			opts []sqlstore.Option
			want bool
		}{
			{"default", nil, true},
			{"off", []sqlstore.Option{sqlstore.WithMaxLocalHandOffs(0)}, false},
		} {
			t.Run(name+"/"+mode.name, func(t *testing.T) {
				ev := testenv.NewEvents()
				s := migrated(t, url, append(mode.opts, sqlstore.WithObserver(ev))...)
				other := open(t, url)
				ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
				defer cancel()
				key := "local-handoffs:" + mode.name + ":" + time.Now().Format(time.RFC3339Nano)
				// The key's fence runs an hour ahead of the server's clock
				// (a clock stepped back): the fences that follow come from
				// the row, not the clock.
				testenv.AcquireRelease(ctx, t, s, key, time.Second)
				locks, _, _ := s.Tables()
				execSQL(t, s, "UPDATE "+locks+" SET fence = fence + 3600000000 WHERE lock_key = ?", []byte(key))
				var (
					inside atomic.Int32
					mu     sync.Mutex
					fences []uint64
					wg     sync.WaitGroup
				)
				for range 6 {
					wg.Go(func() {
						for range 15 {
							l, err := s.Acquire(ctx, key, 5*time.Second)
							if err != nil {
								t.Error(err)
								return
							}
							if n := inside.Add(1); n != 1 {
								t.Errorf("%d holders at once", n)
							}
							mu.Lock()
							fences = append(fences, l.Fence())
							mu.Unlock()
							inside.Add(-1)
							if err := l.Release(ctx); err != nil {
								t.Error(err)
							}
						}
					})
				}
				wg.Wait()
				for i := 1; i < len(fences); i++ {
					if fences[i] <= fences[i-1] {
						t.Fatalf("lease %d's fence %d is not above the one before, %d", i, fences[i], fences[i-1])
					}
				}
				n := localHandOffs(ev)
				switch {
				case mode.want && n < len(fences)/4:
					t.Errorf("%d of %d leases handed on inside the Store, want most", n, len(fences))
				case !mode.want && n != 0:
					t.Errorf("%d leases handed on with hand-offs off", n)
				}
				l, err := other.TryAcquire(ctx, key, time.Second)
				if err != nil {
					t.Fatal(err)
				}
				defer l.Release(context.Background())
				if last := fences[len(fences)-1]; l.Fence() <= last {
					t.Errorf("another Store's fence %d is not above the last handed out, %d", l.Fence(), last)
				}
			})
		}
	}
}

// A Store whose goroutines keep a key busy among themselves lets it go
// after WithMaxLocalHandOffs hand-offs: another process waiting for it
// gets it, rather than wait until the Store's goroutines stop.
func TestLocalHandOffsLetOthersIn(t *testing.T) {
	for name, url := range handOffDatabases(t) {
		t.Run(name, func(t *testing.T) {
			s := migrated(t, url, sqlstore.WithMaxLocalHandOffs(2), sqlstore.WithMaxLocalHold(0))
			other := open(t, url)
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			key := "handoffs-let-others-in:" + time.Now().Format(time.RFC3339Nano)
			busy, stop := context.WithCancel(ctx)
			defer stop()
			var wg sync.WaitGroup
			defer wg.Wait()
			for range 4 {
				wg.Go(func() {
					for busy.Err() == nil {
						l, err := s.Acquire(busy, key, 5*time.Second)
						if err != nil {
							continue
						}
						time.Sleep(time.Millisecond)
						_ = l.Release(ctx)
					}
				})
			}
			time.Sleep(100 * time.Millisecond) // the key passes between the goroutines
			wait, cancelWait := context.WithTimeout(ctx, 5*time.Second)
			defer cancelWait()
			l, err := other.Acquire(wait, key, time.Second)
			stop()
			if err != nil {
				t.Fatalf("another process waited for the key while the Store's goroutines took turns: %v", err)
			}
			_ = l.Release(ctx)
		})
	}
}

// A lease handed on is over: its Refresh reports the lock lost and its
// Release does nothing; the next lease holds the key until its own
// Release, which lets it go. When the hold's last lease is not released
// (its process stopped), the key is another process's after the lease's
// TTL, at a fence above the handed-on lease's.
func TestHandedOnLease(t *testing.T) {
	for name, url := range handOffDatabases(t) {
		t.Run(name, func(t *testing.T) {
			s, other := migrated(t, url), open(t, url)
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			key := "handed-on:" + time.Now().Format(time.RFC3339Nano)
			first, got := heldWithAWaiter(ctx, t, s, key, time.Second)
			if err := first.Release(ctx); err != nil {
				t.Fatal(err)
			}
			second := <-got
			if second == nil {
				t.FailNow()
			}
			defer second.Release(context.Background())
			if second.Fence() <= first.Fence() {
				t.Errorf("the handed-on lease's fence %d is not above the first's, %d", second.Fence(), first.Fence())
			}
			if err := first.Refresh(ctx, time.Second); !errors.Is(err, lock.ErrLockLost) {
				t.Errorf("refresh of a lease handed on: %v, want lock.ErrLockLost", err)
			}
			if err := first.Release(ctx); err != nil {
				t.Errorf("second release of a lease handed on: %v", err)
			}
			if err := second.Refresh(ctx, time.Second); err != nil {
				t.Fatalf("refresh of the lease handed the key: %v", err)
			}
			if _, err := other.TryAcquire(ctx, key, time.Second); !errors.As(err, new(*lock.BusyError)) {
				t.Fatalf("another process took the key from the handed-on lease: %v", err)
			}
			// The second lease's process stops: its lease is never
			// released, and the key is another's after its TTL.
			start := time.Now()
			third, err := other.Acquire(ctx, key, time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer third.Release(context.Background())
			if time.Since(start) < 500*time.Millisecond {
				t.Errorf("another process took the key %v after the holder's refresh for a second", time.Since(start))
			}
			if third.Fence() <= second.Fence() {
				t.Errorf("the next holder's fence %d is not above the handed-on lease's, %d", third.Fence(), second.Fence())
			}
		})
	}
}

// A hold whose key was taken from it (ForceRelease) hands nothing on: the
// Release reports the lock lost, and the Store's waiter takes the key in
// the database, at a higher fence.
func TestHandOffOfALostHold(t *testing.T) {
	for name, url := range handOffDatabases(t) {
		t.Run(name, func(t *testing.T) {
			s, admin := migrated(t, url), open(t, url)
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			key := "lost-hold:" + time.Now().Format(time.RFC3339Nano)
			first, got := heldWithAWaiter(ctx, t, s, key, 5*time.Second)
			if _, err := admin.ForceRelease(ctx, key); err != nil {
				t.Fatal(err)
			}
			if err := first.Release(ctx); !errors.Is(err, lock.ErrLockLost) {
				t.Errorf("release of a hold taken away: %v, want lock.ErrLockLost", err)
			}
			second := <-got
			if second == nil {
				t.FailNow()
			}
			defer second.Release(context.Background())
			if second.Fence() <= first.Fence() {
				t.Errorf("the waiter's fence %d is not above the lost hold's, %d", second.Fence(), first.Fence())
			}
		})
	}
}
