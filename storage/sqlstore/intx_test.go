package sqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/storage/sqlstore"
)

// A Guard run that writes in a transaction its framework owns completes
// its record in that transaction (sqlstore.InTx): committed, the record
// and the write are both there; rolled back, neither is, and the key runs
// again.
func TestInTx(t *testing.T) {
	for name, dbURL := range databases(t) {
		t.Run(name, func(t *testing.T) {
			s := migrated(t, dbURL)
			createCounters(t, s)
			g, err := idem.NewGuard(s, idem.WithTTL(2*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			ctx := t.Context()
			key := idemdriver.ScopedKey("intx", time.Now().Format(time.RFC3339Nano))
			handler := func(commit bool) ([]byte, bool, error) {
				tx, err := s.DB().BeginTx(ctx, nil) // the framework's transaction
				if err != nil {
					t.Fatal(err)
				}
				res, replayed, err := g.Do(ctx, key, "fp", func(ctx context.Context) ([]byte, error) {
					if err := bump(ctx, tx, s.Dialect(), key, 10); err != nil {
						return nil, err
					}
					return []byte("sold"), idem.Commit(ctx, sqlstore.InTx(tx))
				})
				if commit && err == nil {
					if cerr := tx.Commit(); cerr != nil {
						t.Fatal(cerr)
					}
				} else {
					_ = tx.Rollback()
				}
				return res, replayed, err
			}
			if _, _, err := handler(false); err != nil {
				t.Fatalf("Do in a transaction then rolled back: %v", err)
			}
			if n := count(t, s, key); n != 0 {
				t.Fatalf("rolled back, the write is there (%d)", n)
			}
			info, err := s.InspectRecord(ctx, key)
			if err != nil || info.State == idemdriver.Completed {
				t.Fatalf("rolled back, the record is %v (%v)", info.State, err)
			}
			// The rolled-back claim stays in flight until its lease ends;
			// then the retry runs, and this time the framework commits.
			time.Sleep(2100 * time.Millisecond)
			if res, replayed, err := handler(true); err != nil || replayed || string(res) != "sold" {
				t.Fatalf("the retry: %q replayed=%v %v", res, replayed, err)
			}
			if res, replayed, err := handler(true); err != nil || !replayed || string(res) != "sold" {
				t.Fatalf("a duplicate after the commit: %q replayed=%v %v", res, replayed, err)
			}
			if n := count(t, s, key); n != 1 {
				t.Errorf("the write is there %d times, want 1", n)
			}
		})
	}
}

// CompleteInTx completes a claim in the caller's transaction only while
// the claim is the caller's.
func TestCompleteInTx(t *testing.T) {
	for name, dbURL := range databases(t) {
		t.Run(name, func(t *testing.T) {
			s := migrated(t, dbURL)
			ctx := t.Context()
			key := idemdriver.ScopedKey("complete-in-tx", time.Now().Format(time.RFC3339Nano))
			c, err := s.Begin(ctx, idemdriver.MustKey(key), "fp", 5*time.Second)
			if err != nil || c.State != idemdriver.Acquired {
				t.Fatalf("Begin: %v %v", c.State, err)
			}
			tx, err := s.DB().BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			stranger := c
			stranger.Token = "not-the-claim"
			if err := s.CompleteInTx(ctx, tx, stranger, []byte("x"), time.Minute); !errors.Is(err, lock.ErrLockLost) {
				t.Errorf("CompleteInTx with another token: %v, want ErrLockLost", err)
			}
			_ = tx.Rollback()
			tx, err = s.DB().BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.CompleteInTx(ctx, tx, c, []byte("done"), time.Minute); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			got, err := s.Begin(ctx, idemdriver.MustKey(key), "fp", time.Second)
			if err != nil || got.State != idemdriver.Completed || string(got.Result) != "done" {
				t.Errorf("after the commit: %v %q %v", got.State, got.Result, err)
			}
			if err := s.CompleteWith(ctx, c, nil, time.Minute, sqlstore.InTx(nil)); !errors.Is(err, idem.ErrEffectUnsupported) {
				t.Errorf("InTx(nil): %v, want ErrEffectUnsupported", err)
			}
			if err := s.CompleteWith(ctx, c, nil, time.Minute, func() error { return nil }); !errors.Is(err, idem.ErrEffectUnsupported) {
				t.Errorf("an effect of another driver: %v, want ErrEffectUnsupported", err)
			}
		})
	}
}

// Cleanup deletes the rows whose expiry and fence are a minute behind the
// server's clock, and nothing else.
func TestCleanup(t *testing.T) {
	for name, dbURL := range databases(t) {
		t.Run(name, func(t *testing.T) {
			s := migrated(t, dbURL, sqlstore.WithTablePrefix("cleanup_test_"), sqlstore.WithCleanup(0, 2))
			ctx := t.Context()
			locks, waiters, records := s.Tables()
			for _, table := range []string{locks, waiters, records} {
				execSQL(t, s, "DELETE FROM "+table)
			}
			old := time.Now().Add(-2 * time.Minute).UnixMicro()
			for i := range 5 {
				k := []byte{'o', byte('0' + i)}
				execSQL(t, s, "INSERT INTO "+locks+" (lock_key, token, owner, holds, fence, expires_us) VALUES (?, '', ?, 0, ?, ?)", k, []byte{}, old, old)
				execSQL(t, s, "INSERT INTO "+records+" (record_key, state, fingerprint, token, fence, expires_us) VALUES (?, 2, ?, '', ?, ?)", k, []byte("fp"), old, old)
			}
			execSQL(t, s, "INSERT INTO "+waiters+" (lock_key, waiter, seq, expires_us) VALUES (?, 'w', 1, ?)", []byte("o0"), old)
			live, err := s.TryAcquire(ctx, "live", time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			defer live.Release(context.Background())
			if _, err := s.TryAcquire(ctx, "recent", time.Millisecond); err != nil { // soon expired, its fence recent
				t.Fatal(err)
			}
			n, err := s.Cleanup(ctx)
			if err != nil || n != 11 {
				t.Errorf("Cleanup deleted %d rows (%v), want 11 (batches of 2)", n, err)
			}
			var left int
			if err := s.DB().QueryRowContext(ctx, "SELECT COUNT(*) FROM "+locks).Scan(&left); err != nil || left != 2 {
				t.Errorf("%d lock rows left (%v), want the live and the recent one", left, err)
			}
			if _, err := s.TryAcquire(ctx, "recent", time.Second); err != nil {
				t.Errorf("the expired key: %v", err)
			}
		})
	}
}

// CompleteInTx in a caller's transaction at REPEATABLE READ whose snapshot
// predates the claim's last write (the watchdog extended it): PostgreSQL
// refuses the update, every time, and the error says what to do.
func TestCompleteInTxRepeatableReadSaysWhy(t *testing.T) {
	s := migrated(t, databases(t)["postgres"])
	ctx := t.Context()
	key := "intx-rr-" + time.Now().Format(time.RFC3339Nano)
	c, err := s.Begin(ctx, idemdriver.MustKey(key), "fp", 10*time.Second)
	if err != nil || c.State != idemdriver.Acquired {
		t.Fatalf("Begin: %+v %v", c, err)
	}
	tx, err := s.DB().BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	_, _, records := s.Tables()
	var n int
	if err := tx.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+records).Scan(&n); err != nil { // the snapshot
		t.Fatal(err)
	}
	if err := s.Extend(ctx, c, 10*time.Second); err != nil { // the watchdog, meanwhile
		t.Fatal(err)
	}
	err = s.CompleteInTx(ctx, tx, c, []byte("r"), time.Minute)
	if err == nil || !strings.Contains(err.Error(), "READ COMMITTED") {
		t.Fatalf("CompleteInTx at REPEATABLE READ after an Extend = %v, want an error that names READ COMMITTED", err)
	}
}

// InTx's effect is one the caller commits: the middlewares refuse it
// (idem.ErrCallerCommits) instead of answering before that commit.
func TestInTxRefusedUnderMiddleware(t *testing.T) {
	if _, ok := sqlstore.InTx(nil).(idemdriver.CallerCommits); !ok {
		t.Fatal("sqlstore.InTx's effect is not an idemdriver.CallerCommits")
	}
	g, err := idem.NewGuard(migrated(t, databases(t)["postgres"]))
	if err != nil {
		t.Fatal(err)
	}
	var commitErr error
	_, _, err = g.Do(idemdriver.AnswersOnReturn(t.Context()), "intx-mw-"+time.Now().Format(time.RFC3339Nano), "fp", func(ctx context.Context) ([]byte, error) {
		commitErr = idem.Commit(ctx, sqlstore.InTx(nil))
		return nil, commitErr
	})
	if !errors.Is(commitErr, idem.ErrCallerCommits) || !errors.Is(err, idem.ErrCallerCommits) {
		t.Fatalf("Commit(InTx) under a middleware's run = %v (Do %v), want idem.ErrCallerCommits", commitErr, err)
	}
}

// The cleanup passes over rows other transactions hold: a live key whose
// row is locked (a statement or transaction on it in flight) neither
// holds up the cleanup nor is held up by it. (On MySQL the locks table
// has no expiry index, and a scanning DELETE at InnoDB's default
// REPEATABLE READ would wait for every locked row it passes.)
func TestCleanupPassesLockedRows(t *testing.T) {
	for name, dbURL := range databases(t) {
		t.Run(name, func(t *testing.T) {
			prefix := "cleanup_locked_" + strconv.FormatInt(time.Now().UnixNano()%1e9, 10) + "_"
			s := migrated(t, dbURL, sqlstore.WithTablePrefix(prefix), sqlstore.WithCleanup(0, 100))
			locks, _, _ := s.Tables()
			old := time.Now().Add(-2 * time.Minute).UnixMicro()
			for i := range 20 {
				execSQL(t, s, "INSERT INTO "+locks+" (lock_key, token, owner, holds, fence, expires_us) VALUES (?, '', ?, 0, ?, ?)",
					[]byte{'o', byte('a' + i)}, []byte{}, old, old)
			}
			// Keys freed lately, as a table in use holds (on a table of a
			// few rows MySQL scans the table whatever the statement).
			recent := time.Now().Add(time.Minute).UnixMicro()
			for i := range 300 {
				execSQL(t, s, "INSERT INTO "+locks+" (lock_key, token, owner, holds, fence, expires_us) VALUES (?, '', ?, 0, ?, ?)",
					[]byte("f"+strconv.Itoa(1000+i)), []byte{}, recent, recent)
			}
			if s.Dialect() == sqlstore.MySQL {
				execSQL(t, s, "ANALYZE TABLE "+locks)
			}
			live, err := s.TryAcquire(t.Context(), "live", time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			defer live.Release(context.Background())
			tx, err := s.DB().BeginTx(t.Context(), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			if _, err := tx.ExecContext(t.Context(), rebind(s, "SELECT token FROM "+locks+" WHERE lock_key = ? FOR UPDATE"), []byte("live")); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			if n, err := s.Cleanup(ctx); err != nil || n != 20 {
				t.Errorf("Cleanup beside a locked live row: %d rows deleted, %v; want the 20 old ones at once", n, err)
			}
			tx.Rollback()
			execSQL(t, s, "DROP TABLE "+prefix+"locks, "+prefix+"lock_waiters, "+prefix+"records")
		})
	}
}

// The cleanup loops of the Stores on the same tables take turns: one of
// them cleans per interval, not each (every run scans the locks table).
func TestCleanupTakesTurns(t *testing.T) {
	for name, dbURL := range databases(t) {
		t.Run(name, func(t *testing.T) {
			prefix := "cleanup_turns_" + strconv.FormatInt(time.Now().UnixNano()%1e9, 10) + "_"
			admin := migrated(t, dbURL, sqlstore.WithTablePrefix(prefix), sqlstore.WithCleanup(0, 100))
			const interval = 300 * time.Millisecond
			stores := []*sqlstore.Store{
				open(t, dbURL, sqlstore.WithTablePrefix(prefix), sqlstore.WithCleanup(interval, 100)),
				open(t, dbURL, sqlstore.WithTablePrefix(prefix), sqlstore.WithCleanup(interval, 100)),
				open(t, dbURL, sqlstore.WithTablePrefix(prefix), sqlstore.WithCleanup(interval, 100)),
			}
			start := time.Now()
			time.Sleep(10 * interval)
			for _, s := range stores {
				s.Close()
			}
			var runs int64
			for _, s := range stores {
				runs += s.CleanupRuns()
			}
			// Each Store ticks 10 times; a turn lasts 9/10 of an interval,
			// so at most one run per 0.9 interval went ahead.
			if limit := int64(time.Since(start)/(interval*9/10)) + 1; runs < 1 || runs > limit {
				t.Errorf("3 Stores cleaning every %v for %v ran %d cleanups, want 1 to %d (one per interval)", interval, time.Since(start).Round(time.Millisecond), runs, limit)
			}
			execSQL(t, admin, "DROP TABLE "+prefix+"locks, "+prefix+"lock_waiters, "+prefix+"records")
		})
	}
}

// A completion with an Effect checks the claim before it runs the effect:
// a claim lost (its lease ran out and another Begin took the key) is
// ErrLockLost and the effect is not run at all — not run and rolled back,
// which would still hold its rows' locks (a SKU's stock, shared by every
// buyer) for the statement's round trip.
func TestLostClaimDoesNotRunEffect(t *testing.T) {
	for name, dbURL := range databases(t) {
		t.Run(name, func(t *testing.T) {
			s, other := migrated(t, dbURL), open(t, dbURL)
			ctx := t.Context()
			key := idemdriver.MustKey(idemdriver.ScopedKey("lost-claim-effect", time.Now().Format(time.RFC3339Nano)))
			c, err := s.Begin(ctx, key, "fp", 50*time.Millisecond)
			if err != nil || c.State != idemdriver.Acquired {
				t.Fatalf("Begin: %v %v", c.State, err)
			}
			var next idemdriver.Claim
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				if next, err = other.Begin(ctx, key, "fp", time.Minute); err != nil {
					t.Fatal(err)
				}
				if next.State == idemdriver.Acquired || time.Now().After(deadline) {
					break
				}
			}
			if next.State != idemdriver.Acquired {
				t.Fatalf("the key was not taken over: %v", next.State)
			}
			ran := 0
			err = s.CompleteWith(ctx, c, []byte("late"), time.Minute, sqlstore.Effect(func(context.Context, *sql.Tx) error {
				ran++
				return nil
			}))
			if !errors.Is(err, lock.ErrLockLost) || ran != 0 {
				t.Errorf("completion of the lost claim: %v, the effect ran %d times; want ErrLockLost and no run", err, ran)
			}
			if err := other.Complete(ctx, next, []byte("ok"), time.Minute); err != nil {
				t.Errorf("the new claim's completion: %v", err)
			}
		})
	}
}

// The cleanup finds records by sweep_us, set when they are claimed to
// their lease plus the Store's last retention: a record past it that may
// not go yet (its retention or attempt memory runs longer) is kept and
// looked at again when it may go; one not past it is not looked at.
func TestCleanupSweep(t *testing.T) {
	for name, dbURL := range databases(t) {
		t.Run(name, func(t *testing.T) {
			prefix := "sweep_" + strconv.FormatInt(time.Now().UnixNano()%1e9, 10) + "_"
			s := migrated(t, dbURL, sqlstore.WithTablePrefix(prefix), sqlstore.WithCleanup(0, 2))
			ctx := t.Context()
			_, _, records := s.Tables()
			t.Cleanup(func() {
				locks, waiters, _ := s.Tables()
				execSQL(t, s, "DROP TABLE "+locks+", "+waiters+", "+records)
			})
			now := time.Now()
			old, hour := now.Add(-2*time.Minute).UnixMicro(), now.Add(time.Hour).UnixMicro()
			insert := "INSERT INTO " + records + " (record_key, state, fingerprint, token, fence, expires_us, sweep_us) VALUES (?, ?, ?, '', ?, ?, ?)"
			execSQL(t, s, insert, []byte("kept"), 2, []byte("fp"), old, hour, 0)      // retained an hour longer than guessed
			execSQL(t, s, insert, []byte("memory"), 1, []byte("fp"), old, old, 0)     // in flight, expired: its attempt is remembered
			execSQL(t, s, insert, []byte("not-yet"), 2, []byte("fp"), old, old, hour) // may go, not looked at yet
			execSQL(t, s, insert, []byte("gone"), 2, []byte("fp"), old, old, old)     // may go, looked at
			sweep := func(key string) int64 {
				t.Helper()
				var v int64
				if err := s.DB().QueryRowContext(ctx, rebind(s, "SELECT sweep_us FROM "+records+" WHERE record_key = ?"), []byte(key)).Scan(&v); err != nil {
					t.Fatalf("%s: %v", key, err)
				}
				return v
			}
			if n, err := s.Cleanup(ctx); err != nil || n != 1 {
				t.Fatalf("Cleanup deleted %d rows (%v), want 1 (gone)", n, err)
			}
			if v := sweep("kept"); v != hour {
				t.Errorf("kept: sweep_us %d, want its expiry %d", v, hour)
			}
			if v, want := sweep("memory"), old+idem.AttemptMemory.Microseconds(); v != want {
				t.Errorf("memory: sweep_us %d, want its expiry plus the attempt memory %d", v, want)
			}
			if v := sweep("not-yet"); v != hour {
				t.Errorf("not-yet: sweep_us %d, want it unchanged (%d)", v, hour)
			}
			// Once it may go, it goes.
			execSQL(t, s, "UPDATE "+records+" SET expires_us = ?, sweep_us = ? WHERE record_key = ?", old, old, []byte("kept"))
			if n, err := s.Cleanup(ctx); err != nil || n != 1 {
				t.Fatalf("Cleanup deleted %d rows (%v), want 1 (kept, now expired)", n, err)
			}

			// A claim sets sweep_us to its lease plus the last retention (the
			// default before one), at most the attempt memory.
			for i, c := range []struct{ want, next time.Duration }{
				{24 * time.Hour, time.Hour}, {time.Hour, 48 * time.Hour}, {idem.AttemptMemory, time.Hour},
			} {
				retention := c.want
				key := "claimed-" + strconv.Itoa(i)
				t0 := time.Now()
				claim, err := s.Begin(ctx, idemdriver.MustKey(key), "fp", time.Minute)
				if err != nil {
					t.Fatal(err)
				}
				v := time.UnixMicro(sweep(key))
				if lo, hi := t0.Add(time.Minute+retention-time.Minute), time.Now().Add(time.Minute+retention+time.Minute); v.Before(lo) || v.After(hi) {
					t.Errorf("claim %d: sweep_us %v, want its lease plus %v from now", i, v, retention)
				}
				if err := s.Complete(ctx, claim, []byte("r"), c.next); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// While most of a Store's Begins find their key held (a burst of replays
// and duplicates), a Begin reads the record first: every answer is the
// one a claim would give — a replay, a duplicate in flight, a mismatch, a
// corrupt record — and a key the read finds free, expired or absent is
// claimed.
func TestBeginWhileKeysAreHeld(t *testing.T) {
	for name, dbURL := range databases(t) {
		t.Run(name, func(t *testing.T) {
			s := migrated(t, dbURL)
			ctx := t.Context()
			_, _, records := s.Tables()
			prefix := "held-burst:" + time.Now().Format(time.RFC3339Nano) + ":"
			key := func(k string) idemdriver.Key { return idemdriver.MustKey(prefix + k) }
			done, err := s.Begin(ctx, key("done"), "fp", time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Complete(ctx, done, []byte("result"), time.Minute); err != nil {
				t.Fatal(err)
			}
			for range 20 { // (most recent Begins found their key held)
				if c, err := s.Begin(ctx, key("done"), "fp", time.Minute); err != nil || c.State != idemdriver.Completed || string(c.Result) != "result" {
					t.Fatalf("replay: %+v, %v", c, err)
				}
			}
			if c, err := s.Begin(ctx, key("done"), "other", time.Minute); err != nil || c.State != idemdriver.Mismatch {
				t.Errorf("another fingerprint: %+v, %v; want a mismatch", c, err)
			}
			flying, err := s.Begin(ctx, key("flying"), "fp", time.Minute)
			if err != nil || flying.State != idemdriver.Acquired {
				t.Fatalf("a new key among replays: %+v, %v", flying, err)
			}
			if c, err := s.Begin(ctx, key("flying"), "fp", time.Minute); err != nil || c.State != idemdriver.InFlight {
				t.Errorf("a duplicate of a claim in flight: %+v, %v", c, err)
			}
			short, err := s.Begin(ctx, key("short"), "fp", 50*time.Millisecond)
			if err != nil || short.State != idemdriver.Acquired {
				t.Fatal(short, err)
			}
			time.Sleep(100 * time.Millisecond)
			if c, err := s.Begin(ctx, key("short"), "fp", time.Minute); err != nil || c.State != idemdriver.Acquired || c.Attempt != 2 || c.Fence <= short.Fence {
				t.Errorf("a claim past its lease: %+v, %v; want it claimed again (attempt 2, a higher fence than %d)", c, err, short.Fence)
			}
			execSQL(t, s, "INSERT INTO "+records+" (record_key, state, fingerprint, token, fence, expires_us) VALUES (?, 1, ?, '', 1, ?)",
				[]byte(key("corrupt").String()), []byte("fp"), time.Now().Add(time.Hour).UnixMicro())
			if _, err := s.Begin(ctx, key("corrupt"), "fp", time.Minute); !errors.Is(err, idem.ErrCorruptRecord) {
				t.Errorf("a corrupt record: %v, want ErrCorruptRecord", err)
			}
		})
	}
}
