package sqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/idem/idemtest"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/lock/locktest"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/stock/stockdriver"
	"github.com/oncekit/oncekit/stock/stocktest"
	"github.com/oncekit/oncekit/storage/sqlstore"
)

// holderURLEnv tells a holder process of locktest which database to hold
// its key in.
const holderURLEnv = "ONCEKIT_SQLSTORE_HOLDER_URL"

func TestMain(m *testing.M) {
	if url := os.Getenv(effectChildURL); url != "" {
		runEffectChild(url, os.Getenv(effectChildKey)) // never returns
	}
	// A holder process of the lock suite, a runner process of the idem suite.
	newStore := func() (*sqlstore.Store, error) {
		return sqlstore.Open(context.Background(), os.Getenv(holderURLEnv))
	}
	locktest.RunHolder(func() (lock.Locker, error) { return newStore() })
	idemtest.RunRunner(func() (idemdriver.Store, error) { return newStore() })
	stocktest.RunWorker(func() (stockdriver.Store, error) { return newStore() })
	goleak.VerifyTestMain(m)
}

// databases are the servers every test runs on, by name.
func databases(t *testing.T) map[string]string {
	return map[string]string{"postgres": testenv.PostgresURL(t), "mysql": testenv.MySQLURL(t)}
}

// suiteDatabases are databases plus the connection settings the
// conformance suites must pass under too: MySQL with clientFoundRows=true
// (an ON DUPLICATE KEY UPDATE that changes nothing reports a row; the
// idempotency suite runs it without INSERT ... RETURNING, as on MySQL 8;
// both suites through a *sql.DB of sql.Open's, which sends statements as
// text: see suiteStore), and
// PostgreSQL whose sessions default to REPEATABLE READ, and PostgreSQL
// behind pgbouncer in transaction pooling mode (no LISTEN, no named
// prepared statements: notify=false and pgx's exec mode).
func suiteDatabases(t *testing.T) map[string]string {
	dbs := databases(t)
	if os.Getenv("PGBOUNCER_URL") != "" || testenv.Required() {
		dbs["postgres-pgbouncer"] = withParam(testenv.PgBouncerURL(t), "notify=false&default_query_exec_mode=exec")
	}
	dbs["mysql-found-rows"] = withParam(dbs["mysql"], "clientFoundRows=true")
	dbs["postgres-repeatable-read"] = withParam(dbs["postgres"], "options="+strings.ReplaceAll(url.QueryEscape(`-c default_transaction_isolation=repeatable\ read`), "+", "%20"))
	return dbs
}

// withParam adds a query parameter to a URL.
func withParam(u, param string) string {
	if strings.Contains(u, "?") {
		return u + "&" + param
	}
	return u + "?" + param
}

// open returns a Store on url with its own connection pool (as another
// process would have), closed at the end of the test.
func open(t testing.TB, url string, opts ...sqlstore.Option) *sqlstore.Store {
	t.Helper()
	s, err := sqlstore.Open(context.Background(), url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// suiteStore is open for the conformance suites' configuration name: on
// "mysql-found-rows", a Store made by New over a *sql.DB of sql.Open's
// (its statements go as text, not prepared per connection as on Open's).
func suiteStore(t testing.TB, name, rawURL string, opts ...sqlstore.Option) *sqlstore.Store {
	t.Helper()
	if name != "mysql-found-rows" {
		return open(t, rawURL, opts...)
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	dsn, err := sqlstore.MySQLDSN(u)
	if err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(sqlstore.DefaultMaxConns)
	s, err := sqlstore.New(db, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(); db.Close() })
	return s
}

// migrated opens a Store on url and applies the schema.
func migrated(t testing.TB, url string, opts ...sqlstore.Option) *sqlstore.Store {
	t.Helper()
	s := open(t, url, opts...)
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s
}

// execSQL runs a statement written with ? placeholders on s's database.
func execSQL(t testing.TB, s *sqlstore.Store, query string, args ...any) sql.Result {
	t.Helper()
	res, err := s.DB().ExecContext(context.Background(), rebind(s, query), args...)
	if err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return res
}

func rebind(s *sqlstore.Store, query string) string { return s.Dialect().Rebind(query) }

// lockRecordRow runs query (with ? placeholders; it names the records
// table by %s) for key's record in a transaction that stays open, its row
// locks held, until t ends.
func lockRecordRow(ctx context.Context, t *testing.T, s *sqlstore.Store, query, key string) {
	t.Helper()
	_, _, records := s.Tables()
	tx, err := s.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback() })
	if _, err := tx.ExecContext(ctx, rebind(s, fmt.Sprintf(query, records)), []byte(key)); err != nil {
		t.Fatal(err)
	}
}

func TestConformance(t *testing.T) {
	t.Parallel()
	for name, url := range suiteDatabases(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel() // (keys are the suite's own, random)
			migrated(t, url)
			locktest.Run(t, locktest.Config{
				NewLocker:     func(t *testing.T) lock.Locker { return suiteStore(t, name, url) },
				Reentrant:     true,
				HolderProcess: true,
				ProcessEnv:    []string{holderURLEnv + "=" + url},
			})
		})
	}
}

func TestIdemConformance(t *testing.T) {
	t.Parallel()
	for name, url := range suiteDatabases(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			admin := migrated(t, url)
			_, _, records := admin.Tables()
			createCounters(t, admin)
			var opts []sqlstore.Option
			if name == "mysql-found-rows" {
				// The claim MySQL 8 makes (no INSERT ... RETURNING), on
				// MariaDB; "mysql" runs MariaDB's.
				opts = append(opts, sqlstore.WithoutReturning())
			}
			idemtest.Run(t, idemtest.Config{
				NewStore:      func(t *testing.T) idemdriver.Store { return suiteStore(t, name, url, opts...) },
				RunnerProcess: true,
				ProcessEnv:    []string{holderURLEnv + "=" + url},
				Corrupt: func(t *testing.T, key string) {
					// An in-flight record without a token: corrupt in every
					// layout (a state this layout lacks is another
					// layout's: idem.ErrUnknownLayout, TestStoredLayouts).
					execSQL(t, admin, "INSERT INTO "+records+" (record_key, state, fingerprint, token, fence, expires_us) VALUES (?, 1, ?, '', 1, ?)",
						[]byte(key), []byte("garbage"), time.Now().Add(time.Hour).UnixMicro())
				},
				Effect: func(t *testing.T, key string, limit int) (any, func() int) {
					effect := sqlstore.Effect(func(ctx context.Context, tx *sql.Tx) error {
						return bump(ctx, tx, admin.Dialect(), key, limit)
					})
					return effect, func() int { return count(t, admin, key) }
				},
			})
		})
	}
}

// counters is the table the effects of the tests write: a counter per key.
const counters = "sqlstore_test_effects"

func createCounters(t testing.TB, s *sqlstore.Store) {
	t.Helper()
	if s.Dialect() == sqlstore.Postgres {
		execSQL(t, s, "CREATE TABLE IF NOT EXISTS "+counters+" (k bytea PRIMARY KEY, n integer NOT NULL)")
	} else {
		execSQL(t, s, "CREATE TABLE IF NOT EXISTS "+counters+" (k VARBINARY(512) PRIMARY KEY, n INT NOT NULL)")
	}
}

// bump adds one to key's counter in tx, refusing once it reached limit.
func bump(ctx context.Context, tx *sql.Tx, d sqlstore.Dialect, key string, limit int) error {
	if limit <= 0 {
		return errors.New("limit reached")
	}
	q := "INSERT INTO " + counters + " (k, n) VALUES (?, 1) ON DUPLICATE KEY UPDATE n = IF(n < ?, n + 1, n)"
	if d == sqlstore.Postgres {
		q = "INSERT INTO " + counters + " AS c (k, n) VALUES ($1, 1) ON CONFLICT (k) DO UPDATE SET n = c.n + 1 WHERE c.n < $2"
	}
	res, err := tx.ExecContext(ctx, q, []byte(key), limit)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return errors.New("limit reached")
	}
	return nil
}

// count reads key's counter.
func count(t testing.TB, s *sqlstore.Store, key string) int {
	t.Helper()
	var n int
	err := s.DB().QueryRowContext(context.Background(), rebind(s, "SELECT n FROM "+counters+" WHERE k = ?"), []byte(key)).Scan(&n)
	if errors.Is(err, sql.ErrNoRows) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return n
}
