package sqlstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/storage/sqlstore"
)

// countedStore is a Store on PostgreSQL with tables of its own (a prefix
// of the test's, no cleanup loop) and a count of the statements that ran
// on its records table and match like after the table's name, by
// pg_stat_statements (which scripts/services.sh preloads).
func countedStore(t *testing.T, like string) (*sqlstore.Store, func() int64) {
	t.Helper()
	url := testenv.PostgresURL(t)
	admin := open(t, url)
	if _, err := admin.DB().Exec("CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
		t.Fatalf("pg_stat_statements (scripts/services.sh preloads it): %v", err)
	}
	prefix := fmt.Sprintf("counted%d_", time.Now().UnixNano())
	s := migrated(t, url, sqlstore.WithTablePrefix(prefix), sqlstore.WithCleanup(0, 500))
	locks, waiters, records := s.Tables()
	t.Cleanup(func() { _, _ = admin.DB().Exec("DROP TABLE IF EXISTS " + records + ", " + locks + ", " + waiters) })
	return s, func() int64 {
		var n int64
		if err := admin.DB().QueryRow("SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements WHERE query LIKE $1",
			"%"+records+like).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
}

// A duplicate of a claim the Store holds, in the same process, is answered
// and woken there: it waits for the run and replays its result, with no
// statement that marks the record watched (PostgreSQL, counted by
// pg_stat_statements on a table prefix of the test's own); a duplicate
// with another fingerprint is a mismatch at once.
func TestDuplicateInProcessWaitsHere(t *testing.T) {
	s, watches := countedStore(t, " SET watched = %")

	g, err := idem.NewGuard(s, idem.WithWait(20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	key := "dup-here"
	started, release := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	var runs int
	wg.Go(func() {
		res, replayed, err := g.Do(ctx, key, "fp", func(context.Context) ([]byte, error) {
			runs++
			close(started)
			<-release
			return []byte("sold"), nil
		})
		if err != nil || replayed || string(res) != "sold" {
			t.Errorf("the first call: %q %v %v", res, replayed, err)
		}
	})
	<-started
	before := watches()
	if _, _, err := g.Do(ctx, key, "another fp", func(context.Context) ([]byte, error) { return nil, nil }); !errors.Is(err, idem.ErrMismatch) {
		t.Errorf("a duplicate with another fingerprint while the run runs: %v, want ErrMismatch", err)
	}
	var dupRes []byte
	var dupReplayed bool
	var dupErr error
	wg.Go(func() {
		dupRes, dupReplayed, dupErr = g.Do(ctx, key, "fp", func(context.Context) ([]byte, error) {
			t.Error("the duplicate ran")
			return nil, nil
		})
	})
	time.Sleep(100 * time.Millisecond) // (the duplicate waits)
	close(release)
	wg.Wait()
	if dupErr != nil || !dupReplayed || string(dupRes) != "sold" || runs != 1 {
		t.Fatalf("the duplicate: %q replayed=%v %v (runs %d), want the first call's result replayed", dupRes, dupReplayed, dupErr, runs)
	}
	if n := watches() - before; n != 0 {
		t.Errorf("the duplicate in the claim's own process marked the record watched %d times, want 0", n)
	}
}

// A claim the Store holds but never finishes (its lease ran out while its
// run was cut off) answers the Store's duplicates only until its lease
// ends: then the database decides, and a duplicate gets what another
// process stored since.
func TestLocalClaimEndsWithItsLease(t *testing.T) {
	for name, url := range databases(t) {
		t.Run(name, func(t *testing.T) {
			s, other := migrated(t, url), migrated(t, url)
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			k := idemdriver.MustKey("local-lease:" + name + ":" + time.Now().Format(time.RFC3339Nano))
			const lease = 400 * time.Millisecond
			c, err := s.Begin(ctx, k, "fp", lease)
			if err != nil || c.State != idemdriver.Acquired {
				t.Fatalf("Begin: %v %v", c.State, err)
			}
			dup, err := s.Begin(ctx, k, "fp", lease)
			if err != nil || dup.State != idemdriver.InFlight {
				t.Fatalf("a duplicate while the claim runs: %v %v, want InFlight", dup.State, err)
			}
			start := time.Now()
			if err := s.WaitChange(ctx, k, time.Now().Add(20*time.Second)); err != nil {
				t.Fatal(err)
			}
			if took := time.Since(start); took > 5*time.Second {
				t.Fatalf("the wait for a claim nobody finishes took %s; its lease was %s", took, lease)
			}
			// Past the lease (by the database's clock too), another process
			// claims the key and stores its result.
			var taken idemdriver.Claim
			for time.Since(start) < 10*time.Second {
				if taken, err = other.Begin(ctx, k, "fp", time.Minute); err != nil || taken.State == idemdriver.Acquired {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			if err != nil || taken.State != idemdriver.Acquired {
				t.Fatalf("another process after the lease: %v %v", taken.State, err)
			}
			if err := other.Complete(ctx, taken, []byte("theirs"), time.Hour); err != nil {
				t.Fatal(err)
			}
			got, err := s.Begin(ctx, k, "fp", lease)
			if err != nil || got.State != idemdriver.Completed || string(got.Result) != "theirs" {
				t.Fatalf("the first process's duplicate after that: %v %q %v, want the other's result", got.State, got.Result, err)
			}
			if err := s.Complete(ctx, c, []byte("mine"), time.Hour); !errors.Is(err, lock.ErrLockLost) {
				t.Fatalf("completing the lost claim: %v, want ErrLockLost", err)
			}
		})
	}
}

// A duplicate of a claim this Store holds is woken by the claim's
// abandonment and takes the key itself; on MySQL (no notifications) as
// at once as on PostgreSQL.
func TestLocalClaimAbandonedWakesDuplicate(t *testing.T) {
	for name, url := range databases(t) {
		t.Run(name, func(t *testing.T) {
			s := migrated(t, url, sqlstore.WithPollInterval(time.Minute))
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			k := idemdriver.MustKey("local-abandon:" + name + ":" + time.Now().Format(time.RFC3339Nano))
			c, err := s.Begin(ctx, k, "fp", time.Minute)
			if err != nil || c.State != idemdriver.Acquired {
				t.Fatalf("Begin: %v %v", c.State, err)
			}
			woke := make(chan time.Duration, 1)
			go func() {
				start := time.Now()
				if err := s.WaitChange(ctx, k, time.Now().Add(time.Minute)); err != nil {
					t.Error(err)
				}
				woke <- time.Since(start)
			}()
			time.Sleep(50 * time.Millisecond)
			if err := s.Abandon(ctx, c); err != nil {
				t.Fatal(err)
			}
			select {
			case d := <-woke:
				if d > 10*time.Second {
					t.Fatalf("woken after %s", d)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("the duplicate was not woken by the abandonment")
			}
			got, err := s.Begin(ctx, k, "fp", time.Minute)
			if err != nil || got.State != idemdriver.Acquired {
				t.Fatalf("the duplicate's Begin after the abandonment: %v %v, want Acquired", got.State, err)
			}
			if err := s.Complete(ctx, got, []byte("ok"), time.Hour); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(got.Key.String(), "local-abandon") {
				t.Fatal("wrong key")
			}
		})
	}
}

// Copies of one request that reach a Store together cost one claim
// statement: the first copy's Begin claims the key, the others wait for
// its answer in the process and find the claim in flight (PostgreSQL,
// counted by pg_stat_statements on a table prefix of the test's own).
func TestConcurrentBeginsShareOneClaim(t *testing.T) {
	s, statements := countedStore(t, "%")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	before := statements()
	k := idemdriver.MustKey("together")
	const copies = 16
	claims := make([]idemdriver.Claim, copies)
	errs := make([]error, copies)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range copies {
		wg.Go(func() {
			<-start
			claims[i], errs[i] = s.Begin(ctx, k, "fp", time.Minute)
		})
	}
	close(start)
	wg.Wait()
	acquired := 0
	for i, c := range claims {
		switch {
		case errs[i] != nil:
			t.Fatalf("copy %d: %v", i, errs[i])
		case c.State == idemdriver.Acquired:
			acquired++
		case c.State != idemdriver.InFlight:
			t.Fatalf("copy %d: state %v, want Acquired or InFlight", i, c.State)
		}
	}
	if acquired != 1 {
		t.Fatalf("%d copies acquired the key, want 1", acquired)
	}
	if n := statements() - before; n != 1 {
		t.Errorf("%d copies sent %d statements on the records table, want 1", copies, n)
	}

	// Completed, the key's replays that arrive together share one look
	// at the record too; a copy with another fingerprint is a mismatch.
	var won idemdriver.Claim
	for _, c := range claims {
		if c.State == idemdriver.Acquired {
			won = c
		}
	}
	if err := s.Complete(ctx, won, []byte("result"), time.Hour); err != nil {
		t.Fatal(err)
	}
	before = statements()
	start = make(chan struct{})
	for i := range copies {
		wg.Go(func() {
			<-start
			fp := "fp"
			if i == copies-1 {
				fp = "another"
			}
			claims[i], errs[i] = s.Begin(ctx, k, fp, time.Minute)
		})
	}
	close(start)
	wg.Wait()
	for i, c := range claims {
		want := idemdriver.Completed
		if i == copies-1 {
			want = idemdriver.Mismatch
		}
		if errs[i] != nil || c.State != want || (want == idemdriver.Completed && string(c.Result) != "result") {
			t.Fatalf("replay %d: %v %q %v, want %v", i, c.State, c.Result, errs[i], want)
		}
	}
	// (One Begin's look is two statements here: a claim that finds the
	// row, then a read. The mismatched copy's answer, if it went first,
	// does not answer the others: theirs is a second look. On a loaded
	// machine a copy the scheduler starts after the shared look has
	// answered makes a look of its own: what the test holds the Store to
	// is sharing — far fewer statements than copies — not the
	// scheduler's timing: without it, 16 copies send 16 looks or more.)
	if n := statements() - before; n > copies/2 {
		t.Errorf("%d replays arriving together sent %d statements on the records table, want at most %d (4 when they all arrive before the first look answers)", copies, n, copies/2)
	}
}

// A Begin of a key whose claim the Store has just finished — the
// duplicate its finish woke — reads the record first: one statement, not
// a claim that finds the row and then a read.
func TestBeginAfterLocalFinishReadsFirst(t *testing.T) {
	s, statements := countedStore(t, "%")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	k := idemdriver.MustKey("finished-here")
	c, err := s.Begin(ctx, k, "fp", time.Minute)
	if err != nil || c.State != idemdriver.Acquired {
		t.Fatalf("Begin: %v %v", c.State, err)
	}
	if err := s.Complete(ctx, c, []byte("done"), time.Hour); err != nil {
		t.Fatal(err)
	}
	before := statements()
	got, err := s.Begin(ctx, k, "fp", time.Minute)
	if err != nil || got.State != idemdriver.Completed || string(got.Result) != "done" {
		t.Fatalf("the replay: %v %q %v", got.State, got.Result, err)
	}
	if n := statements() - before; n != 1 {
		t.Errorf("the replay sent %d statements on the records table, want 1 (a read)", n)
	}
}
