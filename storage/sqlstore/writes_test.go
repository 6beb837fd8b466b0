package sqlstore_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/storage/sqlstore"
)

// writesDatabases are the set-ups Writes runs on: PostgreSQL (one
// statement), PostgreSQL whose sessions default to REPEATABLE READ (a
// contended write falls back to the Store's transaction), MySQL (the
// Store's transaction).
// eachWritesDatabase runs f on each of writesDatabases, with a migrated
// Store, the counters table and a 30 s context.
func eachWritesDatabase(t *testing.T, f func(t *testing.T, name string, s *sqlstore.Store, ctx context.Context)) {
	for name, dbURL := range writesDatabases(t) {
		t.Run(name, func(t *testing.T) {
			var opts []sqlstore.Option
			if name == "mysql-8" {
				// MySQL 8's way, on MariaDB: the writes in the completing
				// transaction (no compound statement outside a stored
				// program); "mysql" runs MariaDB's one statement.
				opts = append(opts, sqlstore.WithoutReturning())
			}
			s := suiteStore(t, name, dbURL, opts...) // ("mysql-found-rows": statements as text)
			if err := s.Migrate(t.Context()); err != nil {
				t.Fatal(err)
			}
			createCounters(t, s)
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			f(t, name, s, ctx)
		})
	}
}

func writesDatabases(t *testing.T) map[string]string {
	dbs := databases(t)
	dbs["mysql-8"] = dbs["mysql"]
	dbs["mysql-found-rows"] = withParam(dbs["mysql"], "clientFoundRows=true")
	dbs["postgres-repeatable-read"] = withParam(dbs["postgres"], "options="+strings.ReplaceAll(url.QueryEscape(`-c default_transaction_isolation=repeatable\ read`), "+", "%20"))
	return dbs
}

// writes are a sale's Writes on key's counter: one unit taken while fewer
// than limit were, and a row of the order's own.
func saleWrites(s *sqlstore.Store, key string, limit int) sqlstore.Writes {
	take := "UPDATE " + counters + " SET n = n + 1 WHERE k = ? AND n < ?"
	order := "INSERT INTO " + counters + " (k, n) VALUES (?, 1)"
	return sqlstore.Writes{
		{Query: order, Args: []any{[]byte(key + ":order")}},
		{Query: take, Args: []any{[]byte(key), limit}, Refuse: "sold out"},
	}
}

// Writes commit with the record, or not at all: sold, both writes and the
// record are there; refused by a write that changed no row, neither the
// other write nor the record is; a claim lost writes nothing; a write the
// database refuses is an effect failure that writes nothing.
func TestWritesCommitWithTheRecord(t *testing.T) {
	eachWritesDatabase(t, func(t *testing.T, name string, s *sqlstore.Store, ctx context.Context) {
		base := "writes:" + name + ":" + time.Now().Format(time.RFC3339Nano)
		stock := base + ":stock"
		execSQL(t, s, "INSERT INTO "+counters+" (k, n) VALUES (?, 0)", []byte(stock))
		g, err := idem.NewGuard(s)
		if err != nil {
			t.Fatal(err)
		}
		sell := func(key string, limit int) ([]byte, bool, error) {
			return g.Do(ctx, key, "fp", func(ctx context.Context) ([]byte, error) {
				w := saleWrites(s, stock, limit)
				w[0].Args = []any{[]byte(key + ":order")}
				return []byte("sold " + key), idem.Commit(ctx, w)
			})
		}

		res, replayed, err := sell(base+":a", 1)
		if err != nil || replayed || string(res) != "sold "+base+":a" {
			t.Fatalf("a sale: %q %v %v", res, replayed, err)
		}
		if n, o := count(t, s, stock), count(t, s, base+":a:order"); n != 1 || o != 1 {
			t.Fatalf("after a sale: stock taken %d, order rows %d; want 1 and 1", n, o)
		}
		if res, replayed, err := sell(base+":a", 1); err != nil || !replayed || string(res) != "sold "+base+":a" {
			t.Fatalf("its replay: %q %v %v", res, replayed, err)
		}

		_, _, err = sell(base+":b", 1) // the limit is reached
		var refused *idem.EffectRefusedError
		if !errors.As(err, &refused) || refused.Reason != "sold out" {
			t.Fatalf("a sale past the limit: %v, want refused with the write's reason", err)
		}
		if n, o := count(t, s, stock), count(t, s, base+":b:order"); n != 1 || o != 0 {
			t.Fatalf("after a refused sale: stock taken %d, order rows %d; want 1 and 0", n, o)
		}
		if info, err := s.InspectRecord(ctx, base+":b"); err == nil && info.State == idemdriver.Completed {
			t.Fatalf("a refused sale's record is completed")
		}

		// A claim that is not the record's: nothing is written.
		c, err := s.Begin(ctx, idemdriver.MustKey(base+":c"), "fp", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		stale := c
		stale.Token = "not-the-claims"
		w := saleWrites(s, stock, 10)
		w[0].Args = []any{[]byte(base + ":c:order")}
		if err := s.CompleteWith(ctx, stale, []byte("r"), time.Minute, w); !errors.Is(err, lock.ErrLockLost) {
			t.Fatalf("Writes with a stale claim: %v, want ErrLockLost", err)
		}
		if n, o := count(t, s, stock), count(t, s, base+":c:order"); n != 1 || o != 0 {
			t.Fatalf("after a lost claim: stock taken %d, order rows %d; want 1 and 0", n, o)
		}

		// A write the database refuses (the order's row exists).
		w[0].Args = []any{[]byte(base + ":a:order")}
		if err := s.CompleteWith(ctx, c, []byte("r"), time.Minute, w); !errors.Is(err, idem.ErrEffectFailed) {
			t.Fatalf("Writes with a duplicate row: %v, want ErrEffectFailed", err)
		}
		if n := count(t, s, stock); n != 1 {
			t.Fatalf("after a failed write: stock taken %d, want 1", n)
		}
		if err := s.CompleteWith(ctx, c, []byte("r"), time.Minute, sqlstore.Writes{}); !errors.Is(err, idem.ErrEffectUnsupported) {
			t.Fatalf("empty Writes: %v, want ErrEffectUnsupported", err)
		}
	})
}

// A completion by Writes notifies a duplicate that waits for the record
// in another process.
func TestWritesWakeADuplicate(t *testing.T) {
	s, dup := migrated(t, testenv.PostgresURL(t)), open(t, testenv.PostgresURL(t))
	createCounters(t, s)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	key := "writes-woken:" + time.Now().Format(time.RFC3339Nano)
	execSQL(t, s, "INSERT INTO "+counters+" (k, n) VALUES (?, 0)", []byte(key))
	c, err := s.Begin(ctx, idemdriver.MustKey(key), "fp", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	woken := duplicateWaits(ctx, dup, idemdriver.MustKey(key))
	time.Sleep(200 * time.Millisecond)
	done := time.Now()
	w := sqlstore.Writes{{Query: "UPDATE " + counters + " SET n = n + 1 WHERE k = ?", Args: []any{[]byte(key)}, Refuse: "gone"}}
	if err := s.CompleteWith(ctx, c, []byte("r"), time.Minute, w); err != nil {
		t.Fatal(err)
	}
	if late := (<-woken).Sub(done); late > 500*time.Millisecond {
		t.Errorf("the duplicate returned %v after the completion, want at once (notified)", late.Round(time.Millisecond))
	}
}

// On sessions at REPEATABLE READ, Writes whose row another transaction
// changed while the statement waited for it (a serialization failure)
// commit through the Store's transaction, at READ COMMITTED, instead.
func TestWritesOnARowChangedMeanwhileAtRepeatableRead(t *testing.T) {
	s := migrated(t, writesDatabases(t)["postgres-repeatable-read"])
	createCounters(t, s)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	key := "writes-rr:" + time.Now().Format(time.RFC3339Nano)
	execSQL(t, s, "INSERT INTO "+counters+" (k, n) VALUES (?, 0)", []byte(key))
	c, err := s.Begin(ctx, idemdriver.MustKey(key), "fp", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := s.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, rebind(s, "UPDATE "+counters+" SET n = n + 10 WHERE k = ?"), []byte(key)); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		w := sqlstore.Writes{{Query: "UPDATE " + counters + " SET n = n + 1 WHERE k = ?", Args: []any{[]byte(key)}, Refuse: "gone"}}
		done <- s.CompleteWith(ctx, c, []byte("r"), time.Minute, w)
	}()
	time.Sleep(200 * time.Millisecond) // (the statement waits for the row)
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Writes on a row changed while it waited, at REPEATABLE READ: %v", err)
	}
	if n := count(t, s, key); n != 11 {
		t.Fatalf("the counter is %d, want 11 (both writes)", n)
	}
	if got, err := s.Begin(ctx, c.Key, "fp", time.Minute); err != nil || got.State != idemdriver.Completed {
		t.Fatalf("the record: %v %v, want completed", got.State, err)
	}
}

// A ? inside a write's string literal or comment is text, not a
// placeholder, on every database; on PostgreSQL ?? is the ? operator
// (jsonb).
func TestWritesQuestionMarkInLiteral(t *testing.T) {
	eachWritesDatabase(t, func(t *testing.T, name string, s *sqlstore.Store, ctx context.Context) {
		g, err := idem.NewGuard(s)
		if err != nil {
			t.Fatal(err)
		}
		key := "writes-literal:" + name + ":" + time.Now().Format(time.RFC3339Nano)
		w := sqlstore.Writes{{
			Query: "INSERT INTO " + counters + " (k, n) /* why? */ VALUES (?, CASE WHEN 'a?' = ? THEN ? ELSE 0 END)",
			Args:  []any{[]byte(key), "a?", 7},
		}}
		want := 7
		if s.Dialect() == sqlstore.Postgres {
			w = append(w, sqlstore.Write{
				Query: "INSERT INTO " + counters + " (k, n) SELECT ?, ? WHERE '{\"a\": 1}'::jsonb ?? 'a' AND $$b?$$ = E'b\\?'",
				Args:  []any{[]byte(key + ":jsonb"), 1},
			})
		}
		if _, _, err := g.Do(ctx, key, "fp", func(ctx context.Context) ([]byte, error) {
			return []byte("ok"), idem.Commit(ctx, w)
		}); err != nil {
			t.Fatal(err)
		}
		if n := count(t, s, key); n != want {
			t.Errorf("the write stored %d, want %d", n, want)
		}
		if s.Dialect() == sqlstore.Postgres && count(t, s, key+":jsonb") != 1 {
			t.Error("the write with ?? (jsonb's ? operator) and literals stored nothing")
		}
	})
}

// On MariaDB a completion by Writes is one statement, one round trip,
// whatever the number of writes (a row they lock stays locked only while
// it runs); MySQL 8's way — checked here on MariaDB — is a transaction of
// statements.
func TestWritesOneStatementOnMariaDB(t *testing.T) {
	for _, c := range []struct {
		name string
		opts []sqlstore.Option
		one  bool
	}{{"mariadb", nil, true}, {"mysql-8", []sqlstore.Option{sqlstore.WithoutReturning()}, false}} {
		t.Run(c.name, func(t *testing.T) {
			s := migrated(t, testenv.MySQLURL(t), c.opts...)
			createCounters(t, s)
			s.DB().SetMaxOpenConns(1) // (one session: its own count of statements)
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			base := "writes-one:" + c.name + ":" + time.Now().Format(time.RFC3339Nano)
			stock := base + ":stock"
			execSQL(t, s, "INSERT INTO "+counters+" (k, n) VALUES (?, 0)", []byte(stock))
			questions := func() int {
				var name string
				var n int
				if err := s.DB().QueryRowContext(ctx, "SHOW SESSION STATUS LIKE 'Questions'").Scan(&name, &n); err != nil {
					t.Fatal(err)
				}
				return n
			}
			sell := func(key string) int {
				claim, err := s.Begin(ctx, idemdriver.MustKey(key), "fp", time.Minute)
				if err != nil {
					t.Fatal(err)
				}
				w := saleWrites(s, stock, 10)
				w[0].Args = []any{[]byte(key + ":order")}
				before := questions()
				if err := s.CompleteWith(ctx, claim, []byte("sold"), time.Minute, w); err != nil {
					t.Fatal(err)
				}
				return questions() - before - 1 // (the count's own)
			}
			sell(base + ":warm") // (the server's version asked, the statement prepared)
			n := sell(base + ":a")
			if c.one && n != 1 || !c.one && n < 2 {
				t.Fatalf("a completion by two writes took %d statements, want %s", n, map[bool]string{true: "1", false: "more than 1"}[c.one])
			}
			if got := count(t, s, stock); got != 2 {
				t.Fatalf("the stock counter is %d, want 2", got)
			}
		})
	}
}
