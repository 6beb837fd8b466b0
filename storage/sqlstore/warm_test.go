package sqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/storage/sqlstore"
)

// Warm leaves n open connections idle in the pool, each with the Store's
// statements prepared where its connections keep them, and the Store
// works on them.
func TestWarm(t *testing.T) {
	for name, url := range suiteDatabases(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			s := suiteStore(t, name, url, sqlstore.WithCleanup(0, 500))
			if err := s.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			s.DB().SetMaxIdleConns(sqlstore.DefaultMaxConns) // (a pool of sql.Open's keeps 2)
			if err := s.Warm(ctx, 4); err != nil {
				t.Fatal(err)
			}
			db := s.DB()
			open := db.Stats().OpenConnections
			if idle := db.Stats().Idle; idle < 4 {
				t.Fatalf("%d idle connections after Warm(4), want 4 or more (%d open)", idle, open)
			}
			stmts := s.WarmStatements()
			conns := make([]*sql.Conn, 4)
			for i := range conns {
				c, err := db.Conn(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				conns[i] = c
			}
			if now := db.Stats().OpenConnections; now != open {
				t.Fatalf("taking 4 connections opened %d more: Warm did not leave them idle", now-open)
			}
			for i, c := range conns {
				n, err := prepared(ctx, s, name, c, stmts)
				if err != nil {
					t.Fatal(err)
				}
				if n >= 0 && n != len(stmts) {
					t.Errorf("connection %d has %d of the %d statements prepared", i, n, len(stmts))
				}
			}
			for _, c := range conns {
				_ = c.Close()
			}
			// The Store works on its warmed connections.
			g, err := idem.NewGuard(s)
			if err != nil {
				t.Fatal(err)
			}
			key := fmt.Sprintf("warm:%d", time.Now().UnixNano())
			if _, _, err := g.Do(ctx, key, "fp", func(context.Context) ([]byte, error) { return []byte("ok"), nil }); err != nil {
				t.Fatal(err)
			}
			l, err := s.Acquire(ctx, key, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// prepared counts the statements of stmts prepared on c's session, or
// returns -1 where its connections keep none: behind pgbouncer (pgx's
// exec mode: unnamed statements) and on a MySQL pool not made by Open.
func prepared(ctx context.Context, s *sqlstore.Store, name string, c *sql.Conn, stmts []string) (int, error) {
	switch {
	case strings.Contains(name, "pgbouncer") || name == "mysql-found-rows":
		return -1, nil
	case s.Dialect() == sqlstore.MySQL:
		return sqlstore.MyPrepared(c, stmts)
	}
	var n int
	err := c.QueryRowContext(ctx, "SELECT count(DISTINCT statement) FROM pg_prepared_statements WHERE statement = ANY($1)", stmts).Scan(&n)
	return n, err
}

// A request on a warmed connection runs the statement Warm prepared on
// it, not a second copy of it.
func TestWarmStatementsAreUsed(t *testing.T) {
	ctx := context.Background()
	db, err := sqlstore.OpenDB(databases(t)["postgres"])
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(2)
	s, err := sqlstore.New(db, sqlstore.WithoutNotify(), sqlstore.WithCleanup(0, 500))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Warm(ctx, 0); err != nil { // (the pool's maximum less one: 1)
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1) // (every statement below on the warmed connection)
	g, err := idem.NewGuard(s)
	if err != nil {
		t.Fatal(err)
	}
	key := fmt.Sprintf("warm-used:%d", time.Now().UnixNano())
	if _, _, err := g.Do(ctx, key, "fp", func(context.Context) ([]byte, error) { return []byte("ok"), nil }); err != nil {
		t.Fatal(err)
	}
	var runs, copies int
	q := "SELECT coalesce(sum(generic_plans + custom_plans) FILTER (WHERE name NOT LIKE 'stmtcache_%'), 0)," +
		" count(*) FILTER (WHERE name LIKE 'stmtcache_%') FROM pg_prepared_statements WHERE statement = ANY($1)"
	if err := db.QueryRowContext(ctx, q, s.WarmStatements()).Scan(&runs, &copies); err != nil {
		t.Fatal(err)
	}
	if runs < 2 || copies != 0 {
		t.Fatalf("the claim and its completion ran %d times through Warm's statements, %d through copies of them; want 2 or more and 0", runs, copies)
	}
}

// Warm asks for no more connections than the pool may open less one, so
// that it does not wait for one the Store keeps, and fails on a closed
// Store.
func TestWarmBounds(t *testing.T) {
	for name, url := range databases(t) {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			db, err := sqlstore.OpenDB(url)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			db.SetMaxOpenConns(3)
			s, err := sqlstore.New(db)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			// One connection kept elsewhere for the whole call, as the
			// Store's LISTEN session is.
			kept, err := db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer kept.Close()
			if err := s.Warm(ctx, 100); err != nil {
				t.Fatal(err)
			}
			if n := db.Stats().OpenConnections; n > 3 {
				t.Fatalf("%d connections open, the pool's maximum is 3", n)
			}
			s.Close()
			if err := s.Warm(ctx, 1); !errors.Is(err, lock.ErrClosed) {
				t.Fatalf("Warm on a closed Store = %v, want lock.ErrClosed", err)
			}
		})
	}
}

// A server that takes connections and never answers fails Warm within
// about a second a connection, rather than passing for a busy pool.
func TestWarmSilentServer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var held []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c) // (kept open, never answered)
			mu.Unlock()
		}
	}()
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			c.Close()
		}
	}()
	for _, url := range []string{"postgres://u@" + ln.Addr().String() + "/db?sslmode=disable", "mysql://u@" + ln.Addr().String() + "/db"} {
		db, err := sqlstore.OpenDB(url)
		if err != nil {
			t.Fatal(err)
		}
		s, err := sqlstore.New(db, sqlstore.WithoutNotify(), sqlstore.WithCleanup(0, 500))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		start := time.Now()
		err = s.Warm(ctx, 2)
		cancel()
		if err == nil {
			t.Errorf("%s: Warm against a server that never answers = nil, want an error", url)
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Errorf("%s: Warm took %v", url, d)
		}
		s.Close()
		db.Close()
	}
}
