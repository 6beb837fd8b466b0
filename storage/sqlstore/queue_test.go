package sqlstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/storage/sqlstore"
)

// Waiters queue in the server (a session lock their holder's connection
// keeps): InspectLock counts them, a release hands the key to them in
// turn, and each one's fence is above the last.
func TestServerQueueHandsOffInTurn(t *testing.T) {
	for name, url := range databases(t) {
		t.Run(name, func(t *testing.T) {
			holder := migrated(t, url)
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			key := "server-queue:" + time.Now().Format(time.RFC3339Nano)
			l, err := holder.TryAcquire(ctx, key, 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			const waiters = 3
			type got struct {
				l   lock.Lease
				err error
			}
			done := make(chan got, waiters)
			for range waiters {
				s := open(t, url) // a process of its own
				go func() {
					wl, err := s.Acquire(ctx, key, 10*time.Second)
					done <- got{wl, err}
				}()
			}
			if name == "postgres" { // (MySQL has no view of GET_LOCK's queue)
				deadline := time.Now().Add(5 * time.Second)
				for {
					info, err := holder.InspectLock(ctx, key)
					if err != nil {
						t.Fatal(err)
					}
					if info.Waiters == waiters {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("InspectLock counts %d waiters, want %d", info.Waiters, waiters)
					}
					time.Sleep(20 * time.Millisecond)
				}
			} else {
				time.Sleep(300 * time.Millisecond)
			}
			last := l.Fence()
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
			for range waiters {
				select {
				case g := <-done:
					if g.err != nil {
						t.Fatal(g.err)
					}
					if g.l.Fence() <= last {
						t.Errorf("fence %d after %d", g.l.Fence(), last)
					}
					last = g.l.Fence()
					if err := g.l.Release(ctx); err != nil {
						t.Fatal(err)
					}
				case <-time.After(5 * time.Second):
					t.Fatal("a waiter did not get the key within 5 s of the release before it")
				}
			}
		})
	}
}

// A lease that ends without a release (its holder forgot it, or lost it)
// gives its session lock back when its deadline passes: the next waiter
// takes the key at the lease's expiry, not a wait budget later.
func TestAbandonedLeaseFreesTheQueue(t *testing.T) {
	for name, url := range databases(t) {
		t.Run(name, func(t *testing.T) {
			holder, waiter := migrated(t, url), open(t, url)
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			key := "abandoned:" + time.Now().Format(time.RFC3339Nano)
			const ttl = 400 * time.Millisecond
			start := time.Now()
			if _, err := holder.TryAcquire(ctx, key, ttl); err != nil { // never released
				t.Fatal(err)
			}
			wl, err := waiter.Acquire(ctx, key, 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer wl.Release(context.Background())
			if took := time.Since(start); took > ttl+400*time.Millisecond {
				t.Errorf("the waiter took the key %v after an abandoned %v lease began, want about its TTL", took.Round(time.Millisecond), ttl)
			}
		})
	}
}

// Holders and waiters keep at most half of a bounded pool: with more locks
// held and waited for than that, the others queue in the waiters table,
// and the holders' own statements still find connections.
func TestQueueKeepsHalfThePool(t *testing.T) {
	for name, url := range databases(t) {
		t.Run(name, func(t *testing.T) {
			migrated(t, url)
			db, err := sqlstore.OpenDB(url)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			db.SetMaxOpenConns(4)
			s, err := sqlstore.New(db)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			prefix := "half-pool:" + time.Now().Format(time.RFC3339Nano)
			time.Sleep(100 * time.Millisecond) // (PostgreSQL: the LISTEN connection)
			base := db.Stats().InUse
			var held []lock.Lease
			for i := range 6 { // six keys held at once, two with a connection each
				l, err := s.TryAcquire(ctx, fmt.Sprintf("%s/%d", prefix, i), 10*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				held = append(held, l)
			}
			// Waiters on two of them, and statements of the holders.
			var wg sync.WaitGroup
			for i := range 2 {
				wg.Go(func() {
					l, err := s.Acquire(ctx, fmt.Sprintf("%s/%d", prefix, i), 10*time.Second)
					if err != nil {
						t.Error(err)
						return
					}
					_ = l.Release(ctx)
				})
			}
			time.Sleep(200 * time.Millisecond)
			qctx, qcancel := context.WithTimeout(ctx, 3*time.Second)
			defer qcancel()
			if err := db.QueryRowContext(qctx, "SELECT 1").Scan(new(int)); err != nil {
				t.Fatalf("a statement beside the locks found no connection: %v", err)
			}
			for _, l := range held {
				if err := l.Refresh(qctx, 10*time.Second); err != nil {
					t.Fatalf("refresh with the pool's connections kept by locks: %v", err)
				}
			}
			for _, l := range held {
				if err := l.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
			wg.Wait()
			if n := db.Stats().InUse; n > base {
				t.Errorf("%d connections in use after every lock was released, %d before any was taken", n, base)
			}
		})
	}
}

// A waiter's statement is bounded by lock_timeout in its every wait: for
// the session lock and, once that was granted, for the row another
// transaction has locked. When the row's wait is what ran out, the session
// lock is the waiter's all the same: it must know so, or a second wait
// takes it again (session locks count holds), the release gives one back,
// and the connection goes back to the pool still holding the key's
// session lock — every later acquirer then queues behind a connection
// nobody uses (seen as a lock suite that crawled under load).
func TestRowWaitTimeoutKeepsSessionLockAccount(t *testing.T) {
	url := testenv.PostgresURL(t)
	admin := migrated(t, url)
	locks, _, _ := admin.Tables()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	key := "row-wait:" + time.Now().Format(time.RFC3339Nano)
	first, err := admin.TryAcquire(ctx, key, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Release(ctx); err != nil { // the row stays, free
		t.Fatal(err)
	}
	// Another transaction holds the free row's lock for longer than the
	// waiter's first wait (a TTL of one second: a budget of a second).
	tx, err := admin.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, "SELECT 1 FROM "+locks+" WHERE lock_key = $1 FOR UPDATE", []byte(key)); err != nil {
		t.Fatal(err)
	}
	waiter := open(t, url)
	got := make(chan error, 1)
	go func() {
		l, err := waiter.Acquire(ctx, key, time.Second)
		if err == nil {
			err = l.Release(ctx)
		}
		got <- err
	}()
	time.Sleep(1500 * time.Millisecond)
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("the waiter's Acquire and Release: %v", err)
	}
	var held int
	if err := admin.DB().QueryRowContext(ctx, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"+
		" AND classid = (($1::bigint >> 32) & 4294967295)::oid AND objid = ($1::bigint & 4294967295)::oid AND objsubid = 1",
		admin.SessionID(key)).Scan(&held); err != nil {
		t.Fatal(err)
	}
	if held != 0 {
		t.Errorf("after the waiter's release, %d sessions still hold the key's session lock", held)
	}
	if l, err := open(t, url).TryAcquire(ctx, key, time.Second); err != nil {
		t.Errorf("TryAcquire of the free key: %v", err)
	} else {
		_ = l.Release(ctx)
	}
}

// The server queue's common statements do not look in the waiters table
// (it would cost every acquisition): a waiter that queues there marks
// the key's row, and a free key so marked is kept for it — a session
// acquisition that comes later takes it only once the waiter left — and
// the mark goes with the last waiter. (After the waiter left, TryAcquire
// takes the key on PostgreSQL, Acquire on MySQL.)
func TestTableWaiterKeepsTheFreeKey(t *testing.T) {
	for name, url := range databases(t) {
		t.Run(name, func(t *testing.T) {
			s := migrated(t, url)
			locks, waiters, _ := s.Tables()
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			key := "table-waiter:" + time.Now().Format(time.RFC3339Nano)
			marked := func() bool {
				t.Helper()
				var q bool
				if err := s.DB().QueryRowContext(ctx, rebind(s, "SELECT queued FROM "+locks+" WHERE lock_key = ?"), []byte(key)).Scan(&q); err != nil {
					t.Fatal(err)
				}
				return q
			}
			held, err := s.TryAcquire(ctx, key, 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.QueueWaiter(ctx, key, "table-waiter"); err != nil {
				t.Fatal(err)
			}
			if !marked() {
				t.Fatal("a waiter queued in the waiters table left the key's row unmarked")
			}
			if err := held.Release(ctx); err != nil {
				t.Fatal(err)
			}
			other := migrated(t, url)
			var busy *lock.BusyError
			if l, err := other.TryAcquire(ctx, key, 10*time.Second); !errors.As(err, &busy) {
				if err == nil {
					_ = l.Release(ctx)
				}
				t.Fatalf("TryAcquire of a free key kept for a queued waiter: %v, want busy", err)
			}
			execSQL(t, s, "DELETE FROM "+waiters+" WHERE lock_key = ?", []byte(key))
			take, what := other.TryAcquire, "TryAcquire"
			if s.Dialect() == sqlstore.MySQL {
				take, what = other.Acquire, "Acquire"
			}
			l, err := take(ctx, key, 10*time.Second)
			if err != nil {
				t.Fatalf("%s of the free key after its waiter left: %v", what, err)
			}
			if marked() {
				t.Error("the key's row is still marked after its last waiter left and the key was taken")
			}
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// Of one Store's acquisitions of a key, one at a time waits in the
// database: a crowd of requests in one process for a held key costs the
// server one queued session, not one per request (nor does it push the
// rest into the waiters table); each still gets the key in turn, and one
// that gives up while it waits for its turn leaves at once.
func TestOneWaiterPerKeyPerStore(t *testing.T) {
	url := testenv.PostgresURL(t)
	holder, s := migrated(t, url), migrated(t, url)
	_, waiters, _ := s.Tables()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	key := "gate:" + time.Now().Format(time.RFC3339Nano)
	held, err := holder.TryAcquire(ctx, key, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	const n = 12
	var wg sync.WaitGroup
	fences := make(chan uint64, n)
	for range n {
		wg.Go(func() {
			l, err := s.Acquire(ctx, key, 10*time.Second)
			if err != nil {
				t.Errorf("Acquire: %v", err)
				return
			}
			fences <- l.Fence()
			if err := l.Release(ctx); err != nil {
				t.Errorf("Release: %v", err)
			}
		})
	}
	gctx, gcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer gcancel()
	if _, err := s.Acquire(gctx, key, 10*time.Second); !errors.Is(err, lock.ErrNotAcquired) {
		t.Errorf("an Acquire whose context ended while it waited for its turn: %v, want lock.ErrNotAcquired", err)
	}
	// Once one acquisition waits in the server (on a loaded machine the
	// first may take a while to get there), it is the only one, a while.
	var queued, tabled int
	look := func() {
		t.Helper()
		if err := s.DB().QueryRowContext(ctx, "SELECT (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"+
			" AND classid = (($1::bigint >> 32) & 4294967295)::oid AND objid = ($1::bigint & 4294967295)::oid AND objsubid = 1),"+
			" (SELECT count(*) FROM "+waiters+" WHERE lock_key = $2)", s.SessionID(key), []byte(key)).Scan(&queued, &tabled); err != nil {
			t.Fatal(err)
		}
	}
	for look(); queued == 0 && ctx.Err() == nil; look() {
		time.Sleep(10 * time.Millisecond)
	}
	for range 20 {
		if queued != 1 || tabled != 0 {
			t.Fatalf("%d acquisitions of one Store waiting: %d sessions queued for the key's session lock and %d places in the waiters table, want 1 and 0", n, queued, tabled)
		}
		time.Sleep(10 * time.Millisecond)
		look()
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(fences)
	last := held.Fence()
	for f := range fences {
		if f <= last {
			t.Errorf("fence %d after %d: the key was not taken in turn", f, last)
		}
		last = f
	}
}
