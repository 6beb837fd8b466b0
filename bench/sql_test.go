package bench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/storage/redisstore"
	"github.com/oncekit/oncekit/storage/sqlstore"
)

// Locks and idempotency on SQL, side by side with what people write by
// hand there and with the Redis driver, in one run. Each worker has its
// own connection pool (a process of its own).

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

// sqlLock is one way to take and give back a lock on SQL.
type sqlLock func(ctx context.Context, key string) (release func() error, err error)

// uniqueInsertLock is the source material's MySQL lock: a table whose
// primary key refuses a second holder, an owner checked on delete, a
// retry every millisecond while the key is taken (no expiry, no fence,
// no queue).
func uniqueInsertLock(b *testing.B, s *sqlstore.Store, db *sql.DB) sqlLock {
	keyType := "VARCHAR(512) CHARACTER SET binary"
	if s.Dialect() == sqlstore.Postgres {
		keyType = "text"
	}
	if _, err := db.Exec("CREATE TABLE IF NOT EXISTS bench_unique_lock (k " + keyType + " PRIMARY KEY, owner " + keyType + " NOT NULL)"); err != nil {
		b.Fatal(err)
	}
	ins, del := "INSERT INTO bench_unique_lock (k, owner) VALUES (?, ?)", "DELETE FROM bench_unique_lock WHERE k = ? AND owner = ?"
	if s.Dialect() == sqlstore.Postgres {
		ins, del = "INSERT INTO bench_unique_lock (k, owner) VALUES ($1, $2)", "DELETE FROM bench_unique_lock WHERE k = $1 AND owner = $2"
	}
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

// advisoryXactLock is PostgreSQL's transaction-scoped advisory lock: the
// lock lives exactly as long as one transaction, the critical section runs
// inside it, and waiting is the server's own.
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
// every cycle by one worker, and one hot key taken by 16 workers in turn,
// through oncekit's sqlstore, the unique-key insert lock, and (PostgreSQL)
// pg_advisory_xact_lock.
func BenchmarkSQLLock(b *testing.B) {
	for _, dbName := range []string{"postgres", "mysql"} {
		url := sqlDatabases(b)[dbName]
		impls := []string{"oncekit", "unique-insert"}
		if dbName == "postgres" {
			impls = append(impls, "advisory-xact")
		}
		for _, c := range []struct {
			name    string
			workers int
			hot     bool
		}{{"new-key/workers=1", 1, false}, {"hot-key/workers=16", 16, true}} {
			for _, impl := range impls {
				b.Run(fmt.Sprintf("%s/%s/%s", dbName, c.name, impl), func(b *testing.B) {
					locks := make([]sqlLock, c.workers)
					for w := range locks {
						s := sqlStore(b, url)
						switch impl {
						case "oncekit":
							locks[w] = oncekitSQLLock(s)
						case "unique-insert":
							locks[w] = uniqueInsertLock(b, s, s.DB())
						default:
							locks[w] = advisoryXactLock(s.DB())
						}
					}
					prefix := fmt.Sprintf("bench-sql-lock:%s:%d", impl, time.Now().UnixNano())
					ctx := context.Background()
					cycles(b, nil, c.workers, func(w int, i int64) error {
						key := prefix
						if !c.hot {
							key += ":" + strconv.FormatInt(i, 10)
						}
						release, err := locks[w](ctx, key)
						if err != nil {
							return err
						}
						return release()
					})
				})
			}
		}
	}
}

// BenchmarkSQLGuard: Guard.Do of a new key, and a replay of a completed
// one, by one worker, on PostgreSQL and MySQL and on the Redis driver.
func BenchmarkSQLGuard(b *testing.B) {
	stores := []string{"postgres", "mysql", "redis"}
	for _, mode := range []string{"new-key", "replay"} {
		for _, name := range stores {
			b.Run(mode+"/"+name, func(b *testing.B) {
				var st idem.Store
				if name == "redis" {
					c, _ := client(b, testenv.RedisAddrs(b, 1)[0])
					rs, err := redisstore.New(c)
					if err != nil {
						b.Fatal(err)
					}
					st = rs
				} else {
					st = sqlStore(b, sqlDatabases(b)[name])
				}
				g, err := idem.NewGuard(st)
				if err != nil {
					b.Fatal(err)
				}
				prefix := fmt.Sprintf("bench-sql-guard:%d", time.Now().UnixNano())
				ctx := context.Background()
				run := func(context.Context) ([]byte, error) { return []byte("ok"), nil }
				if mode == "replay" {
					if _, _, err := g.Do(ctx, prefix, "fp", run); err != nil {
						b.Fatal(err)
					}
				}
				cycles(b, nil, 1, func(_ int, i int64) error {
					key := prefix
					if mode == "new-key" {
						key += ":" + strconv.FormatInt(i, 10)
					}
					_, replayed, err := g.Do(ctx, key, "fp", run)
					if err == nil && replayed != (mode == "replay") {
						err = fmt.Errorf("replayed=%v in %s", replayed, mode)
					}
					return err
				})
			})
		}
	}
}

var _ lock.Locker = (*sqlstore.Store)(nil)
