package sqlstore_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/storage/sqlstore"
)

// migrationLoad is what claimants saw while a Migrate ran.
type migrationLoad struct {
	migrate       time.Duration // how long Migrate took
	during        int           // claims that finished while it ran
	quarters      [4]int        // of those, how many in each quarter of its time
	p50, p99, max time.Duration // latency of the claims that started while it ran
}

// migrateUnderLoad makes a records table of rows rows as an earlier
// version left it (without the sweep index), keeps four claimants
// claiming and completing new keys on it, and runs Migrate.
func migrateUnderLoad(t testing.TB, url string, rows int) migrationLoad {
	ctx := context.Background()
	prefix := fmt.Sprintf("mig%d_", time.Now().UnixNano()%1_000_000_000)
	setup := migrated(t, url, sqlstore.WithTablePrefix(prefix))
	locks, waiters, records := setup.Tables()
	t.Cleanup(func() {
		for _, table := range []string{locks, waiters, records} {
			_, _ = setup.DB().ExecContext(context.Background(), "DROP TABLE IF EXISTS "+table)
		}
	})
	if setup.Dialect() == sqlstore.Postgres {
		execSQL(t, setup, "DROP INDEX "+prefix+"records_sweep")
		execSQL(t, setup, fmt.Sprintf("INSERT INTO %s (record_key, state, fingerprint, token, fence, expires_us, result, sweep_us)"+
			" SELECT convert_to('old-' || g, 'UTF8'), 2, ''::bytea, '', g, 9000000000000000, convert_to('{\"ok\":1}', 'UTF8'), g * 1000 FROM generate_series(1, %d) g", records, rows))
		execSQL(t, setup, "ANALYZE "+records)
	} else {
		execSQL(t, setup, "ALTER TABLE "+records+" DROP INDEX "+prefix+"records_sweep")
		execSQL(t, setup, fmt.Sprintf("INSERT INTO %s (record_key, state, fingerprint, token, fence, expires_us, result, sweep_us)"+
			" SELECT CONCAT('old-', seq), 2, '', '', seq, 9000000000000000, '{\"ok\":1}', seq * 1000 FROM seq_1_to_%d", records, rows))
	}

	claimant := open(t, url, sqlstore.WithTablePrefix(prefix))
	type claim struct{ start, end time.Time }
	var (
		mu     sync.Mutex
		claims []claim
		wg     sync.WaitGroup
	)
	cctx, stop := context.WithCancel(ctx)
	for w := range 4 {
		wg.Go(func() {
			for i := 0; cctx.Err() == nil; i++ {
				start := time.Now()
				k := idemdriver.MustKey(fmt.Sprintf("new-%d-%d-%d", w, i, start.UnixNano()))
				c, err := claimant.Begin(cctx, k, "fp", 10*time.Second)
				if err == nil && c.State == idemdriver.Acquired {
					err = claimant.Complete(cctx, c, []byte("done"), time.Minute)
				}
				if err != nil {
					if cctx.Err() == nil {
						t.Errorf("claim: %v", err)
					}
					return
				}
				mu.Lock()
				claims = append(claims, claim{start, time.Now()})
				mu.Unlock()
			}
		})
	}
	time.Sleep(300 * time.Millisecond) // claimants running
	upgraded := open(t, url, sqlstore.WithTablePrefix(prefix))
	began := time.Now()
	if err := upgraded.Migrate(ctx); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	ended := time.Now()
	time.Sleep(100 * time.Millisecond)
	stop()
	wg.Wait()

	var lat []time.Duration
	load := migrationLoad{migrate: ended.Sub(began)}
	for _, c := range claims {
		if c.end.After(began) && c.end.Before(ended) {
			load.during++
			load.quarters[min(3, int(4*c.end.Sub(began)/ended.Sub(began)))]++
		}
		if !c.start.Before(began) && c.start.Before(ended) {
			lat = append(lat, c.end.Sub(c.start))
		}
	}
	// A claim that started during the migration and was held up by it
	// finished after it: it counts.
	if len(lat) > 0 {
		slices.Sort(lat)
		load.p50, load.p99, load.max = lat[len(lat)/2], lat[len(lat)*99/100], lat[len(lat)-1]
	}
	var has int
	q := "SELECT COUNT(*) FROM pg_indexes WHERE indexname = ?"
	if upgraded.Dialect() != sqlstore.Postgres {
		q = "SELECT COUNT(*) FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE() AND INDEX_NAME = ?"
	}
	if err := upgraded.DB().QueryRowContext(ctx, upgraded.Dialect().Rebind(q), prefix+"records_sweep").Scan(&has); err != nil || has == 0 {
		t.Errorf("the sweep index is not there after Migrate (%d, %v)", has, err)
	}
	return load
}

// Upgrading the tables of a live deployment does not stall it: Migrate
// builds the index that a table of a million records lacks while four
// claimants go on claiming and completing keys on it, and their claims
// keep finishing during the build — before, the build held a lock that
// stopped every write to the table until it was done.
func TestMigrateDoesNotStallClaimants(t *testing.T) {
	if testing.Short() {
		t.Skip("fills a table of a million rows")
	}
	for name, url := range databases(t) {
		t.Run(name, func(t *testing.T) {
			load := migrateUnderLoad(t, url, 1_000_000)
			t.Logf("Migrate took %s; %d claims finished meanwhile (by quarter %v); claims begun meanwhile: p50 %s, p99 %s, max %s",
				load.migrate.Round(time.Millisecond), load.during, load.quarters, load.p50.Round(time.Microsecond), load.p99.Round(time.Microsecond), load.max.Round(time.Microsecond))
			// Claims finish throughout: a build that held writers back would
			// let none finish in the middle of it.
			if load.quarters[1] == 0 || load.quarters[2] == 0 {
				t.Errorf("no claim finished in the middle of a %s migration (by quarter %v): the claimants were stalled", load.migrate.Round(time.Millisecond), load.quarters)
			}
		})
	}
}

// BenchmarkMigrateUnderLoad reports what claimants see while Migrate
// builds the sweep index of a table of a million records (one migration
// per run: -benchtime 1x).
func BenchmarkMigrateUnderLoad(b *testing.B) {
	for _, name := range []string{"postgres", "mysql"} {
		b.Run(name, func(b *testing.B) {
			url := map[string]func(testing.TB) string{"postgres": testenv.PostgresURL, "mysql": testenv.MySQLURL}[name](b)
			for range b.N {
				load := migrateUnderLoad(b, url, 1_000_000)
				b.ReportMetric(float64(load.migrate.Milliseconds()), "migrate-ms")
				b.ReportMetric(float64(load.p99.Microseconds())/1000, "claim-p99-ms")
				b.ReportMetric(float64(load.max.Microseconds())/1000, "claim-max-ms")
				b.ReportMetric(float64(load.during)/load.migrate.Seconds(), "claims/s-during")
			}
		})
	}
}
