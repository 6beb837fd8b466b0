package bench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/storage/redisstore"
	"github.com/oncekit/oncekit/storage/sqlstore"
)

// Locks and idempotency on SQL, side by side with what people write by
// hand there, in one run. Each worker has its own Store and connection
// pool, as a process of its own would. stmts/cycle is what the server
// counted: PostgreSQL's pg_stat_statements calls (BEGIN and COMMIT count),
// MariaDB's Questions.

// sqlDatabases are the servers of the run, by name.
func sqlDatabases(b *testing.B) map[string]string {
	return map[string]string{"postgres": testenv.PostgresURL(b), "mysql": testenv.MySQLURL(b)}
}

func sqlStore(b *testing.B, url string) *sqlstore.Store {
	b.Helper()
	s, err := sqlstore.Open(context.Background(), url)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	if err := s.Migrate(context.Background()); err != nil {
		b.Fatal(err)
	}
	return s
}

// stmtCounter reads how many statements a database server has run.
type stmtCounter func() int64

func newStmtCounter(b *testing.B, s *sqlstore.Store) stmtCounter {
	db := s.DB()
	if s.Dialect() == sqlstore.Postgres {
		// (scripts/services.sh preloads the extension.)
		if _, err := db.Exec("CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
			b.Logf("no statement counts: %v", err)
			return nil
		}
		const q = "SELECT sum(calls)::bigint FROM pg_stat_statements"
		if err := db.QueryRow(q).Scan(new(int64)); err != nil {
			b.Logf("no statement counts (preload pg_stat_statements): %v", err)
			return nil
		}
		return func() int64 {
			var n int64
			if err := db.QueryRow(q).Scan(&n); err != nil {
				b.Fatal(err)
			}
			return n - 1 // (this one)
		}
	}
	return func() int64 {
		var name string
		var n int64
		if err := db.QueryRow("SHOW GLOBAL STATUS LIKE 'Questions'").Scan(&name, &n); err != nil {
			b.Fatal(err)
		}
		return n - 1
	}
}

// sqlRun runs b.N cycles of work across workers, each pausing pause after
// each cycle, and reports cycles/s, the latency of the timed part of a
// cycle (work returns it) and the statements per cycle.
func sqlRun(b *testing.B, count stmtCounter, workers int, pause time.Duration, work func(w int, i int64) (time.Duration, error)) {
	b.Helper()
	var (
		next   atomic.Int64
		failed atomic.Value
		mu     sync.Mutex
		lat    = make([]time.Duration, 0, b.N)
		wg     sync.WaitGroup
	)
	var stmts0 int64
	if count != nil {
		stmts0 = count()
	}
	cpu0, scpu0 := processCPU(b), sqlServerCPU()
	b.ResetTimer()
	start := time.Now()
	for w := range workers {
		wg.Go(func() {
			local := make([]time.Duration, 0, b.N/workers+1)
			defer func() { mu.Lock(); lat = append(lat, local...); mu.Unlock() }()
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				d, err := work(w, i)
				if err != nil {
					failed.Store(err)
					return
				}
				local = append(local, d)
				if pause > 0 {
					time.Sleep(pause)
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	cpu, scpu := processCPU(b)-cpu0, sqlServerCPU()-scpu0
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
	pct := percentilesMs(lat)
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "client-cpu-µs/cycle")
	if scpu0 > 0 {
		b.ReportMetric(float64(scpu.Microseconds())/float64(b.N), "server-cpu-µs/cycle")
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "cycles/s")
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
	if count != nil {
		b.ReportMetric(float64(count()-stmts0)/float64(b.N), "stmts/cycle")
	}
}

// sqlServerCPU is the CPU time the database servers of this machine
// have used so far: every postgres and mariadbd (mysqld) process's.
func sqlServerCPU() time.Duration { return testenv.ProcessesCPU("postgres", "mariadbd", "mysqld") }

// sqlLock is one way to take and give back a lock on SQL.
type sqlLock func(ctx context.Context, key string) (release func() error, err error)

// seedLock is the source material's MySQL lock: a table whose primary key
// refuses a second holder, an owner checked on delete, a retry every
// millisecond while the key is taken (no expiry, no fence, no queue).
func seedLock(b *testing.B, s *sqlstore.Store) sqlLock {
	db := s.DB()
	keyType := "VARCHAR(512) CHARACTER SET binary"
	if s.Dialect() == sqlstore.Postgres {
		keyType = "text"
	}
	if _, err := db.Exec("CREATE TABLE IF NOT EXISTS bench_unique_lock (k " + keyType + " PRIMARY KEY, owner " + keyType + " NOT NULL)"); err != nil {
		b.Fatal(err)
	}
	ins := s.Dialect().Rebind("INSERT INTO bench_unique_lock (k, owner) VALUES (?, ?)")
	del := s.Dialect().Rebind("DELETE FROM bench_unique_lock WHERE k = ? AND owner = ?")
	var n atomic.Int64
	return func(ctx context.Context, key string) (func() error, error) {
		owner := strconv.FormatInt(n.Add(1), 10)
		for {
			_, err := db.ExecContext(ctx, ins, key, owner)
			if err == nil {
				return func() error { _, err := db.ExecContext(ctx, del, key, owner); return err }, nil
			}
			var pg *pgconn.PgError
			var my *mysql.MySQLError
			// Taken: a duplicate key (or, on InnoDB, a deadlock between two
			// inserts of a key being deleted), asked again in a millisecond.
			if !(errors.As(err, &pg) && pg.Code == "23505") && !(errors.As(err, &my) && (my.Number == 1062 || my.Number == 1213)) {
				return nil, err
			}
			time.Sleep(time.Millisecond)
		}
	}
}

// advisorySessionLock is pg_advisory_lock on a connection held for the
// lock's life: the server queues the waiters.
func advisorySessionLock(db *sql.DB) sqlLock {
	return func(ctx context.Context, key string) (func() error, error) {
		conn, err := db.Conn(ctx)
		if err != nil {
			return nil, err
		}
		if _, err := conn.ExecContext(ctx, "SELECT pg_advisory_lock(hashtext($1))", key); err != nil {
			_ = conn.Close()
			return nil, err
		}
		return func() error {
			_, err := conn.ExecContext(ctx, "SELECT pg_advisory_unlock(hashtext($1))", key)
			return errors.Join(err, conn.Close())
		}, nil
	}
}

// advisoryXactLock is PostgreSQL's transaction-scoped advisory lock: the
// lock lives exactly as long as one transaction.
func advisoryXactLock(db *sql.DB) sqlLock {
	return func(ctx context.Context, key string) (func() error, error) {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return nil, err
		}
		if _, err := tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock(hashtext($1))", key); err != nil {
			_ = tx.Rollback()
			return nil, err
		}
		return tx.Commit, nil
	}
}

func oncekitSQLLock(s *sqlstore.Store) sqlLock {
	return func(ctx context.Context, key string) (func() error, error) {
		l, err := s.Acquire(ctx, key, 10*time.Second)
		if err != nil {
			return nil, err
		}
		return func() error { return l.Release(ctx) }, nil
	}
}

// BenchmarkSQLLock: acquire + release on PostgreSQL and MySQL, a new key
// every cycle (1 and 16 workers), and one hot key taken by 16 workers in
// turn (with and without a 1 ms pause after each cycle), through oncekit's
// sqlstore, the seed lock (a unique-key insert retried every millisecond)
// and, on PostgreSQL, pg_advisory_lock on a held connection and
// pg_advisory_xact_lock. Each worker is a process of its own (its own
// pool), except in goroutines=16: 16 goroutines of one process share one
// Store and its pool. The latency is the acquisition's.
func BenchmarkSQLLock(b *testing.B) {
	for _, dbName := range []string{"postgres", "mysql"} {
		url := sqlDatabases(b)[dbName]
		impls := []string{"oncekit", "seed-lock"}
		if dbName == "postgres" {
			impls = append(impls, "advisory-session", "advisory-xact")
		}
		for _, c := range []struct {
			name    string
			workers int
			hot     bool
			pause   time.Duration
			shared  bool // the workers are goroutines of one process (one Store, one pool)
		}{
			{"new-key/workers=1", 1, false, 0, false},
			{"new-key/workers=16", 16, false, 0, false},
			{"hot-key/procs=16", 16, true, 0, false},
			{"hot-key-pause-1ms/procs=16", 16, true, time.Millisecond, false},
			{"hot-key/goroutines=16", 16, true, 0, true},
		} {
			for _, impl := range impls {
				b.Run(fmt.Sprintf("%s/%s/%s", dbName, c.name, impl), func(b *testing.B) {
					locks := make([]sqlLock, c.workers)
					var count stmtCounter
					var s *sqlstore.Store
					for w := range locks {
						if w == 0 || !c.shared {
							s = sqlStore(b, url)
						}
						if w == 0 {
							count = newStmtCounter(b, s)
						}
						switch impl {
						case "oncekit":
							locks[w] = oncekitSQLLock(s)
						case "seed-lock":
							locks[w] = seedLock(b, s)
						case "advisory-session":
							locks[w] = advisorySessionLock(s.DB())
						default:
							locks[w] = advisoryXactLock(s.DB())
						}
					}
					prefix := fmt.Sprintf("bench-sql-lock:%s:%d", impl, time.Now().UnixNano())
					ctx := context.Background()
					for w := range locks { // connections made, statements prepared
						release, err := locks[w](ctx, prefix+":warm:"+strconv.Itoa(w))
						if err != nil {
							b.Fatal(err)
						}
						if err := release(); err != nil {
							b.Fatal(err)
						}
					}
					sqlRun(b, count, c.workers, c.pause, func(w int, i int64) (time.Duration, error) {
						key := prefix
						if !c.hot {
							key += ":" + strconv.FormatInt(i, 10)
						}
						t0 := time.Now()
						release, err := locks[w](ctx, key)
						if err != nil {
							return 0, err
						}
						d := time.Since(t0)
						return d, release()
					})
				})
			}
		}
	}
}

// handWritten is the idempotency a team writes by hand on SQL (as Stripe
// describes it): a row inserted for a new key (ON CONFLICT DO NOTHING,
// MySQL's INSERT IGNORE), updated with the result when the work is done;
// a duplicate reads the row.
type handWritten struct {
	db                   *sql.DB
	claim, finish, reads string
}

func newHandWritten(b *testing.B, s *sqlstore.Store) *handWritten {
	db := s.DB()
	h := &handWritten{db: db}
	if s.Dialect() == sqlstore.Postgres {
		if _, err := db.Exec("CREATE TABLE IF NOT EXISTS bench_idem (k text PRIMARY KEY, state text NOT NULL, result bytea)"); err != nil {
			b.Fatal(err)
		}
		h.claim = "INSERT INTO bench_idem (k, state) VALUES ($1, 'started') ON CONFLICT DO NOTHING"
		h.finish = "UPDATE bench_idem SET state = 'done', result = $1 WHERE k = $2"
		h.reads = "SELECT state, result FROM bench_idem WHERE k = $1"
	} else {
		if _, err := db.Exec("CREATE TABLE IF NOT EXISTS bench_idem (k VARCHAR(512) CHARACTER SET binary PRIMARY KEY, state VARCHAR(16) NOT NULL, result BLOB)"); err != nil {
			b.Fatal(err)
		}
		h.claim = "INSERT IGNORE INTO bench_idem (k, state) VALUES (?, 'started')"
		h.finish = "UPDATE bench_idem SET state = 'done', result = ? WHERE k = ?"
		h.reads = "SELECT state, result FROM bench_idem WHERE k = ?"
	}
	return h
}

// do runs fn once for key and stores its result, or reads the stored
// one: replayed tells which.
func (h *handWritten) do(ctx context.Context, key string, fn func() []byte) (replayed bool, err error) {
	res, err := h.db.ExecContext(ctx, h.claim, key)
	if err != nil {
		return false, err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		var state string
		var result []byte
		return true, h.db.QueryRowContext(ctx, h.reads, key).Scan(&state, &result)
	}
	_, err = h.db.ExecContext(ctx, h.finish, fn(), key)
	return false, err
}

// doWithEffect is do for a run with an effect in the database: the
// record completed and the effect (stmt, a write to a row every run
// shares: a SKU's stock) in one transaction, the record first, as a
// careful team writes it.
func (h *handWritten) doWithEffect(ctx context.Context, key, stmt string) error {
	res, err := h.db.ExecContext(ctx, h.claim, key)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("%s: claimed already", key)
	}
	tx, err := h.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, h.finish, []byte("ok"), key); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, stmt); err != nil {
		return err
	}
	return tx.Commit()
}

// sharedRow makes the row every run's effect writes (effect mode) and
// returns the statement that writes it.
func sharedRow(b *testing.B, s *sqlstore.Store) string {
	db := s.DB()
	ins := "INSERT INTO bench_stock (id, n) VALUES (1, 0) ON CONFLICT DO NOTHING"
	if s.Dialect() == sqlstore.MySQL {
		ins = "INSERT IGNORE INTO bench_stock (id, n) VALUES (1, 0)"
	}
	for _, q := range []string{"CREATE TABLE IF NOT EXISTS bench_stock (id INT PRIMARY KEY, n BIGINT NOT NULL)", ins} {
		if _, err := db.Exec(q); err != nil {
			b.Fatal(err)
		}
	}
	return "UPDATE bench_stock SET n = n + 1 WHERE id = 1"
}

// BenchmarkSQLGuard: Guard.Do of a new key and a replay of a completed
// one, by 1 and 16 workers, on PostgreSQL and MySQL, against the
// hand-written version on the same database (and the Redis driver for
// scale); and a new key whose run commits an effect that writes one row
// every run shares (the flash sale's stock: "effect"), as a
// sqlstore.Effect and as sqlstore.Writes ("oncekit-writes"), against the
// hand-written transaction.
func BenchmarkSQLGuard(b *testing.B) {
	for _, mode := range []string{"new-key", "replay", "effect"} {
		for _, workers := range []int{1, 16} {
			for _, name := range []string{"postgres", "mysql", "redis"} {
				impls := []string{"oncekit", "hand-written"}
				if mode == "effect" {
					// (the effect as sqlstore.Writes: one statement with
					// the completion on PostgreSQL and MariaDB)
					impls = append(impls, "oncekit-writes")
				}
				if name == "redis" {
					if mode == "effect" {
						continue
					}
					impls = impls[:1]
				}
				for _, impl := range impls {
					b.Run(fmt.Sprintf("%s/workers=%d/%s/%s", mode, workers, name, impl), func(b *testing.B) {
						sqlGuardCase(b, mode, workers, name, impl)
					})
				}
			}
		}
	}
}

// BenchmarkSQLService: Guard.Do of a new key by 4 and by 64 requests at
// once in one process — one Store and its pool of sqlstore.DefaultMaxConns
// connections, as an API server has — on PostgreSQL and MySQL, against
// the hand-written version on one pool of the same size. Concurrent
// claims and completions share statements on PostgreSQL (sqlstore's
// batching); each request still waits for its own.
func BenchmarkSQLService(b *testing.B) {
	for _, requests := range []int{4, 64} {
		for _, name := range []string{"postgres", "mysql"} {
			for _, impl := range []string{"oncekit", "hand-written"} {
				b.Run(fmt.Sprintf("new-key/requests=%d/%s/%s", requests, name, impl), func(b *testing.B) {
					sqlGuardCase(b, "service", requests, name, impl)
				})
			}
		}
	}
}

func sqlGuardCase(b *testing.B, mode string, workers int, name, impl string) {
	do := make([]func(ctx context.Context, key string) (bool, error), workers)
	var count stmtCounter
	run := func(context.Context) ([]byte, error) { return []byte("ok"), nil }
	built := do
	if mode == "service" { // one process: every worker shares the first's Store
		built = do[:1]
		mode = "new-key"
	}
	for w := range built {
		var st idemdriver.Store
		if name == "redis" {
			c, _ := client(b, testenv.RedisAddrs(b, 1)[0])
			rs, err := redisstore.New(c)
			if err != nil {
				b.Fatal(err)
			}
			st = rs
		} else {
			s := sqlStore(b, sqlDatabases(b)[name])
			if w == 0 {
				count = newStmtCounter(b, s)
			}
			stmt := ""
			if mode == "effect" {
				stmt = sharedRow(b, s)
			}
			if impl == "hand-written" {
				h := newHandWritten(b, s)
				do[w] = func(ctx context.Context, key string) (bool, error) {
					if stmt != "" {
						return false, h.doWithEffect(ctx, key, stmt)
					}
					return h.do(ctx, key, func() []byte { return []byte("ok") })
				}
				continue
			}
			st = s
			if stmt != "" {
				var effect any = sqlstore.Effect(func(ctx context.Context, tx *sql.Tx) error {
					_, err := tx.ExecContext(ctx, stmt)
					return err
				})
				if impl == "oncekit-writes" {
					effect = sqlstore.Writes{{Query: stmt}}
				}
				g, err := idem.NewGuard(st)
				if err != nil {
					b.Fatal(err)
				}
				do[w] = func(ctx context.Context, key string) (bool, error) {
					_, replayed, err := g.Do(ctx, key, "fp", func(ctx context.Context) ([]byte, error) {
						return []byte("ok"), idem.Commit(ctx, effect)
					})
					return replayed, err
				}
				continue
			}
		}
		g, err := idem.NewGuard(st)
		if err != nil {
			b.Fatal(err)
		}
		do[w] = func(ctx context.Context, key string) (bool, error) {
			_, replayed, err := g.Do(ctx, key, "fp", run)
			return replayed, err
		}
	}
	for w := len(built); w < len(do); w++ {
		do[w] = do[0]
	}
	prefix := fmt.Sprintf("bench-sql-guard:%s:%d", impl, time.Now().UnixNano())
	ctx := context.Background()
	for w := range built { // connections made; the replayed key stored
		warm := prefix
		if mode == "effect" { // (the hand-written effect cannot replay)
			warm += ":warm:" + strconv.Itoa(w)
		}
		if _, err := do[w](ctx, warm); err != nil {
			b.Fatal(err)
		}
	}
	sqlRun(b, count, workers, 0, func(w int, i int64) (time.Duration, error) {
		key := prefix
		if mode != "replay" {
			key += ":" + strconv.FormatInt(i, 10)
		}
		t0 := time.Now()
		replayed, err := do[w](ctx, key)
		if err == nil && replayed != (mode == "replay") {
			err = fmt.Errorf("replayed=%v in %s", replayed, mode)
		}
		return time.Since(t0), err
	})
}

var _ lock.Locker = (*sqlstore.Store)(nil)
