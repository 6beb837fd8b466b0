package sqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib" // registers "pgx"

	"github.com/oncekit/oncekit/storage/driver"
)

// Open connects to the database at rawURL and returns a Store that owns
// it (Close closes the database). rawURL is
//
//	postgres://user:password@host:port/dbname?sslmode=disable   (or postgresql://)
//	mysql://user:password@host:port/dbname
//
// A postgres URL takes pgx's parameters; a mysql URL takes
// go-sql-driver/mysql's DSN parameters as its query. Open pings the
// database; it does not create the tables (see Migrate).
func Open(ctx context.Context, rawURL string, opts ...Option) (*Store, error) {
	rawURL, notify, err := cutNotify(rawURL)
	if err != nil {
		return nil, err
	}
	if !notify {
		opts = append(opts, WithoutNotify())
	}
	db, err := OpenDB(rawURL)
	if err != nil {
		return nil, err
	}
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("sqlstore: %s: %w", redact(rawURL), err)
	}
	s, err := New(db, opts...)
	if err != nil {
		db.Close()
		return nil, err
	}
	s.ownsDB = true
	return s, nil
}

// DefaultMaxConns is the connection pool size of a database OpenDB opens:
// open and idle alike, so that a burst neither forks hundreds of server
// backends nor opens a connection per transaction once the burst ends.
// One of them is the Store's LISTEN connection on PostgreSQL. A database
// serves a few connections per process better than many: every server
// backend costs it a start, plans of its own and a share of every
// snapshot, and statements beyond its cores only wait there — those that
// write a row every request shares (a SKU's stock) in its lock manager,
// where each commit wakes every waiter — while calls that wait here for
// a connection share statements (see "Concurrent requests share
// statements"). Measured in the inventory's flash sale on PostgreSQL,
// three processes: 16 connections each sold 1.3–1.5× as fast as 32, with
// half the p99 (BENCHMARKS.md).
const DefaultMaxConns = 16

// cutNotify takes oncekit's notify=BOOL parameter out of a URL (pgx
// would send it to the server as a setting, go-sql-driver as a variable).
func cutNotify(rawURL string) (string, bool, error) {
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql" && u.Scheme != "mysql") {
		return rawURL, true, nil // (OpenDB says what is wrong)
	}
	q := u.Query()
	v := q.Get("notify")
	if v == "" {
		return rawURL, true, nil
	}
	notify, err := strconv.ParseBool(v)
	if err != nil {
		return "", false, fmt.Errorf("sqlstore: %s: notify=%q is not a boolean", redact(rawURL), v)
	}
	q.Del("notify")
	u.RawQuery = q.Encode()
	return u.String(), notify, nil
}

// OpenDB opens a *sql.DB for rawURL (see Open) without pinging it, with a
// pool of DefaultMaxConns connections (change it with SetMaxOpenConns and
// SetMaxIdleConns). For MySQL it sets what the Store needs from a
// connection: parameters interpolated on the client (one round trip per
// statement instead of three) and the UTC time zone for the server's
// clock; and its connections keep the Store's statements prepared on the
// server (see "Connections" in the package documentation).
func OpenDB(rawURL string) (*sql.DB, error) {
	db, err := openDB(rawURL)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(DefaultMaxConns)
	db.SetMaxIdleConns(DefaultMaxConns)
	db.SetConnMaxIdleTime(5 * time.Minute)
	return db, nil
}

func openDB(rawURL string) (*sql.DB, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("sqlstore: database URL: %w", err)
	}
	switch u.Scheme {
	case "postgres", "postgresql":
		return sql.Open("pgx", rawURL)
	case "mysql":
		dsn, err := MySQLDSN(u)
		if err != nil {
			return nil, err
		}
		cfg, err := mysql.ParseDSN(dsn)
		if err != nil {
			return nil, err
		}
		c, err := mysql.NewConnector(cfg)
		if err != nil {
			return nil, err
		}
		return sql.OpenDB(myConnector{c}), nil
	}
	return nil, fmt.Errorf("sqlstore: database URL scheme %q: want postgres:// or mysql://", u.Scheme)
}

// MySQLDSN turns a mysql:// URL into go-sql-driver/mysql's DSN.
func MySQLDSN(u *url.URL) (string, error) {
	cfg := mysql.NewConfig()
	cfg.Net = "tcp"
	cfg.Addr = u.Host
	if u.Port() == "" {
		cfg.Addr = net.JoinHostPort(u.Hostname(), "3306")
	}
	if u.User != nil {
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
	}
	cfg.DBName = strings.TrimPrefix(u.Path, "/")
	if cfg.DBName == "" {
		return "", fmt.Errorf("sqlstore: %s: no database name (mysql://user@host:port/dbname)", redact(u.String()))
	}
	cfg.InterpolateParams = true
	cfg.Params = map[string]string{"time_zone": "'+00:00'"}
	base := cfg.FormatDSN()
	if q := u.RawQuery; q != "" {
		// Parse the user's parameters through the driver, so that a
		// misspelt one fails here.
		full := base + "&" + q
		if !strings.Contains(base, "?") {
			full = base + "?" + q
		}
		parsed, err := mysql.ParseDSN(full)
		if err != nil {
			return "", fmt.Errorf("sqlstore: %s: %w", redact(u.String()), err)
		}
		return parsed.FormatDSN(), nil
	}
	return base, nil
}

// redact hides a URL's password.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "the database URL"
	}
	return u.Redacted()
}

// Importing the package registers the postgres://, postgresql:// and
// mysql:// schemes with storage.Open.
func init() {
	driver.Register(driver.Info{Package: "sqlstore", Schemes: []string{"postgres", "postgresql", "mysql"}, Open: openURL,
		Usage: `  postgres://user:password@host:port/dbname      PostgreSQL (pgx's parameters: sslmode=...)
  mysql://user:password@host:port/dbname         MySQL 8 or MariaDB (go-sql-driver/mysql's parameters)
  SQL forms create their tables if missing (migrate=false skips that) and
  take prefix=P as the table prefix (default oncekit_); TLS through the
  driver's own parameters. Behind pgbouncer in transaction mode add
  notify=false&default_query_exec_mode=exec.`})
}

// openURL opens a Store that owns its database (Open) and, unless
// migrate=false, creates its tables and adds missing columns before it
// returns, and builds missing indexes in the background (Migrate).
func openURL(ctx context.Context, u *driver.URL) (driver.Store, error) {
	if u.TLS != nil || u.RecordPrefix != "" {
		return nil, fmt.Errorf("store URL %q: %s:// takes TLS settings in the driver's own parameters and one table prefix (prefix=P)", u.Redacted(), u.Scheme)
	}
	migrate := true
	if v := u.Query.Get("migrate"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return nil, fmt.Errorf("store URL %q: migrate=%q is not a boolean", u.Redacted(), v)
		}
		migrate = b
		u.Query.Del("migrate")
		u.RawQuery = u.Query.Encode()
	}
	opts := []Option{WithObserver(u.Observer)}
	if u.Prefix != "" {
		opts = append(opts, WithTablePrefix(u.Prefix))
	}
	ctx, cancel := context.WithTimeout(ctx, u.Timeout)
	defer cancel()
	s, err := Open(ctx, u.String(), opts...)
	if err != nil {
		return nil, err
	}
	if migrate {
		// The tables and columns now; indexes (minutes on a large table,
		// built without blocking writers) in the background.
		if err := s.migrateInBackground(ctx); err != nil {
			s.Close()
			return nil, err
		}
	} else if err := s.CheckLayout(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

var _ driver.Store = (*Store)(nil)
