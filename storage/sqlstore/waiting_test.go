package sqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/storage/sqlstore"
)

// The first waiter takes a key at its holder's expiry even when the holder
// extended its lease after the waiter's last look: a waiter that had
// slept until the old expiry reads the new one and sleeps until then, not
// until its next renewal (a second later on PostgreSQL, where waiters are
// woken by releases and nothing wakes them at an expiry).
func TestFirstWaiterWakesAtExtendedExpiry(t *testing.T) {
	for name, url := range databases(t) {
		t.Run(name, func(t *testing.T) {
			holder, waiter := migrated(t, url), open(t, url)
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			key := "extended-expiry:" + time.Now().Format(time.RFC3339Nano)
			l, err := holder.TryAcquire(ctx, key, time.Second)
			if err != nil {
				t.Fatal(err)
			}
			type got struct {
				at  time.Time
				l   lock.Lease
				err error
			}
			done := make(chan got, 1)
			go func() {
				wl, err := waiter.Acquire(ctx, key, time.Minute)
				done <- got{time.Now(), wl, err}
			}()
			time.Sleep(300 * time.Millisecond)
			refreshed := time.Now()
			if err := l.Refresh(ctx, time.Second); err != nil {
				t.Fatal(err)
			}
			// The holder stops here, as one that died would: its lease
			// ends a second after the refresh.
			g := <-done
			if g.err != nil {
				t.Fatal(g.err)
			}
			defer g.l.Release(context.Background())
			if late := g.at.Sub(refreshed.Add(time.Second)); late > 350*time.Millisecond {
				t.Errorf("the waiter took the key %v after the holder's extended lease ended, want at once (it slept past the expiry it had not read)", late.Round(time.Millisecond))
			}
		})
	}
}

// restartableDB is a database server of the test's own that it can crash
// and start again (testenv.StartPostgres, testenv.StartMariaDB).
type restartableDB interface {
	restartable
	url() string
}

type postgresProc struct{ *testenv.PostgresProcess }

func (p postgresProc) url() string { return p.URL }

type mariaProc struct{ *testenv.MariaDBProcess }

func (p mariaProc) url() string { return p.URL }

// A queued waiter keeps its place while the database crashes and comes
// back: its Acquire asks again until the server answers, and takes the
// key when the holder releases it, instead of failing and leaving its
// place behind — a place that a retry, queued after it, would have waited
// out (the key free for seconds with waiters queued).
func TestWaiterKeepsItsPlaceThroughARestart(t *testing.T) {
	for name, start := range map[string]func(t *testing.T) restartableDB{
		"postgres": func(t *testing.T) restartableDB { return postgresProc{testenv.StartPostgres(t)} },
		"mysql":    func(t *testing.T) restartableDB { return mariaProc{testenv.StartMariaDB(t)} },
	} {
		t.Run(name, func(t *testing.T) {
			srv := start(t)
			holder, waiter := migrated(t, srv.url()), open(t, srv.url())
			ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
			defer cancel()
			const key = "restart-waiter"
			l, err := holder.TryAcquire(ctx, key, 30*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			var wl lock.Lease
			go func() {
				var err error
				wl, err = waiter.Acquire(ctx, key, time.Minute)
				done <- err
			}()
			time.Sleep(300 * time.Millisecond) // queued
			srv.Kill()
			time.Sleep(time.Second)
			srv.Start()
			for {
				err := l.Release(ctx)
				if err == nil {
					break
				}
				if errors.Is(err, lock.ErrLockLost) || ctx.Err() != nil {
					t.Fatalf("the holder's release after the restart: %v", err)
				}
				time.Sleep(20 * time.Millisecond)
			}
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("the waiter's Acquire across the restart: %v, want the key once the holder released it", err)
				}
				defer wl.Release(context.Background())
			case <-time.After(2 * time.Second):
				t.Fatal("the waiter did not take the key within 2 s of its release")
			}
			if wl.Fence() <= l.Fence() {
				t.Errorf("the waiter's fence %d is not above the holder's %d", wl.Fence(), l.Fence())
			}
		})
	}
}

// A duplicate of a completed record reads it without the row's lock: it
// answers while another transaction holds that lock (duplicates of one
// key do not queue behind each other, nor behind a slow writer).
func TestReplayTakesNoRowLock(t *testing.T) {
	for name, url := range databases(t) {
		t.Run(name, func(t *testing.T) {
			s := migrated(t, url)
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			key := "replay-no-lock:" + time.Now().Format(time.RFC3339Nano)
			c, err := s.Begin(ctx, idemdriver.MustKey(key), "fp", time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Complete(ctx, c, []byte("done"), time.Hour); err != nil {
				t.Fatal(err)
			}
			lockRecordRow(ctx, t, s, "SELECT state FROM %s WHERE record_key = ? FOR UPDATE", key)
			bctx, bcancel := context.WithTimeout(ctx, 3*time.Second)
			defer bcancel()
			got, err := s.Begin(bctx, idemdriver.MustKey(key), "fp", time.Minute)
			if err != nil || got.State != idemdriver.Completed || string(got.Result) != "done" {
				t.Fatalf("Begin of a completed key while its row is locked: %+v %v, want the result at once", got, err)
			}
		})
	}
}

// duplicateWaits starts a duplicate's wait for key's record in dup (for
// 20 s at most); the channel gets the time the wait returned.
func duplicateWaits(ctx context.Context, dup *sqlstore.Store, key idemdriver.Key) <-chan time.Time {
	woken := make(chan time.Time, 1)
	go func() {
		_ = dup.WaitChange(ctx, key, time.Now().Add(20*time.Second))
		woken <- time.Now()
	}()
	return woken
}

// On PostgreSQL a duplicate waiting for a claim is woken by its
// completion's notification (a completion notifies only records a
// duplicate marked watched), not by its one-second look.
func TestDuplicateWokenByCompletion(t *testing.T) {
	s, dup := migrated(t, testenv.PostgresURL(t)), open(t, testenv.PostgresURL(t))
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for _, finish := range []string{"complete", "complete-with-effect", "abandon"} {
		t.Run(finish, func(t *testing.T) {
			key := "woken-" + finish + ":" + time.Now().Format(time.RFC3339Nano)
			c, err := s.Begin(ctx, idemdriver.MustKey(key), "fp", time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			woken := duplicateWaits(ctx, dup, idemdriver.MustKey(key))
			time.Sleep(100 * time.Millisecond)
			done := time.Now()
			switch finish {
			case "complete":
				err = s.Complete(ctx, c, []byte("r"), time.Minute)
			case "complete-with-effect":
				err = s.CompleteWith(ctx, c, []byte("r"), time.Minute, sqlstore.Effect(func(context.Context, *sql.Tx) error { return nil }))
			default:
				err = s.Abandon(ctx, c)
			}
			if err != nil {
				t.Fatal(err)
			}
			if late := (<-woken).Sub(done); late > 500*time.Millisecond {
				t.Errorf("the duplicate returned %v after the %s, want at once (notified)", late.Round(time.Millisecond), finish)
			}
		})
	}
}

// A records table made before the watched column gets it from Migrate.
func TestMigrateAddsWatchedColumn(t *testing.T) {
	prefix := "upgrade_" + strconv.FormatInt(time.Now().UnixNano()%1e9, 10) + "_"
	s := migrated(t, testenv.PostgresURL(t), sqlstore.WithTablePrefix(prefix))
	execSQL(t, s, "ALTER TABLE "+prefix+"records DROP COLUMN watched")
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	c, err := s.Begin(ctx, idemdriver.MustKey("k"), "fp", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, c, []byte("r"), time.Minute); err != nil {
		t.Fatalf("Complete after the upgrade: %v", err)
	}
}

// Migrate on a schema in place changes nothing and locks no table: a
// replica that starts while others write (here: a transaction left open
// on each table) is not held up, nor does it hold up their writes.
// (CREATE INDEX IF NOT EXISTS alone would wait for them: it takes its
// table's SHARE lock even when the index exists.) A missing index is
// still made, an old one still dropped.
func TestMigrateInPlaceLocksNoTable(t *testing.T) {
	prefix := "inplace_" + strconv.FormatInt(time.Now().UnixNano()%1e9, 10) + "_"
	s := migrated(t, testenv.PostgresURL(t), sqlstore.WithTablePrefix(prefix))
	locks, waiters, records := s.Tables()
	tx, err := s.DB().BeginTx(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	for _, stmt := range []string{
		"INSERT INTO " + locks + " (lock_key, token, owner, holds, fence, expires_us) VALUES ('\\x01', 't', '\\x00', 1, 1, 0)",
		"INSERT INTO " + waiters + " (lock_key, waiter, seq, expires_us) VALUES ('\\x01', 'w', 1, 0)",
		"INSERT INTO " + records + " (record_key, state, fingerprint, token, fence, expires_us) VALUES ('\\x01', 1, '\\x00', 't', 1, 0)",
	} {
		if _, err := tx.ExecContext(t.Context(), stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	if err := open(t, testenv.PostgresURL(t), sqlstore.WithTablePrefix(prefix)).Migrate(ctx); err != nil {
		t.Fatalf("Migrate beside open transactions: %v", err)
	}
	tx.Rollback()

	// The tables as an earlier version made them: an expiry index on
	// both, no records.sweep_us (nor its index), no locks.queued.
	execSQL(t, s, "ALTER TABLE "+records+" DROP COLUMN sweep_us")
	execSQL(t, s, "CREATE INDEX "+prefix+"records_expires ON "+records+" (expires_us)")
	execSQL(t, s, "CREATE INDEX "+prefix+"locks_expires ON "+locks+" (expires_us)")
	execSQL(t, s, "ALTER TABLE "+locks+" DROP COLUMN queued")
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	var made, dropped, added bool
	if err := s.DB().QueryRowContext(t.Context(), "SELECT to_regclass($1) IS NOT NULL, to_regclass($2) IS NULL AND to_regclass($3) IS NULL,"+
		" EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass($4) AND attname = 'queued' AND NOT attisdropped)",
		prefix+"records_sweep", prefix+"locks_expires", prefix+"records_expires", locks).Scan(&made, &dropped, &added); err != nil {
		t.Fatal(err)
	}
	if !made || !dropped || !added {
		t.Errorf("after Migrate: records_sweep (and records.sweep_us) made %v, expiry indexes dropped %v, locks.queued added %v", made, dropped, added)
	}
}

// Migrate on MySQL drops the expiry indexes of tables made before they
// went (every acquisition, release and completion rewrote their entries),
// and gives the records table its sweep_us column and index.
func TestMySQLMigrateDropsExpiryIndexes(t *testing.T) {
	prefix := "myidx_" + strconv.FormatInt(time.Now().UnixNano()%1e9, 10) + "_"
	s := migrated(t, testenv.MySQLURL(t), sqlstore.WithTablePrefix(prefix))
	locks, _, records := s.Tables()
	execSQL(t, s, "CREATE INDEX "+prefix+"locks_expires ON "+locks+" (expires_us)")
	execSQL(t, s, "ALTER TABLE "+locks+" DROP COLUMN queued")
	execSQL(t, s, "ALTER TABLE "+records+" DROP INDEX "+prefix+"records_sweep, DROP COLUMN sweep_us, ADD INDEX "+prefix+"records_expires (expires_us)")
	for range 2 { // (and again with the index gone, the column there)
		if err := s.Migrate(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	var lockIdx, recIdx, sweepIdx int
	if err := s.DB().QueryRowContext(t.Context(), "SELECT"+
		" (SELECT COUNT(*) FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE() AND INDEX_NAME = ?),"+
		" (SELECT COUNT(*) FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE() AND INDEX_NAME = ?),"+
		" (SELECT COUNT(*) FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE() AND INDEX_NAME = ?)",
		prefix+"locks_expires", prefix+"records_expires", prefix+"records_sweep").Scan(&lockIdx, &recIdx, &sweepIdx); err != nil {
		t.Fatal(err)
	}
	if lockIdx != 0 || recIdx != 0 || sweepIdx == 0 {
		t.Errorf("after Migrate: %d entries of locks_expires and %d of records_expires (want none), %d of records_sweep (want it)", lockIdx, recIdx, sweepIdx)
	}
	var queued int
	if err := s.DB().QueryRowContext(t.Context(), "SELECT COUNT(*) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE()"+
		" AND TABLE_NAME = ? AND COLUMN_NAME = 'queued'", prefix+"locks").Scan(&queued); err != nil {
		t.Fatal(err)
	}
	if queued != 1 {
		t.Error("Migrate did not add the locks table's queued column")
	}
	execSQL(t, s, "DROP TABLE "+prefix+"locks, "+prefix+"lock_waiters, "+prefix+"records")
}
