package sqlstore

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/oncekit/oncekit/core/idem"
)

//go:embed schema/*.sql
var schemas embed.FS

// pgStockFunction is the PostgreSQL function that applies a batch of stock
// operations in one statement (schema/postgres_stock.sql), and its
// signature as to_regprocedure reads it.
const (
	pgStockFunction = "stock_apply_v1"
	pgStockArgs     = "(bytea, smallint[], bytea[], bigint[], bigint[], bigint[])"
)

// stockRoutineDDL is the statement that makes the stock function
// (PostgreSQL) or procedure (MySQL).
func (s *Store) stockRoutineDDL() string {
	b, err := schemas.ReadFile("schema/" + string(s.dialect) + "_stock.sql")
	if err != nil {
		panic(err) // embedded at build time
	}
	var lines []string
	for line := range strings.SplitSeq(string(b), "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "--") {
			lines = append(lines, line)
		}
	}
	return strings.TrimSpace(strings.ReplaceAll(strings.Join(lines, "\n"), "{prefix}", s.prefix))
}

// Tables returns the names of the Store's tables: locks, lock waiters,
// idempotency records.
func (s *Store) Tables() (locks, waiters, records string) {
	return s.prefix + "locks", s.prefix + "lock_waiters", s.prefix + "records"
}

// Schema returns the statements Migrate runs, for users who apply
// migrations with their own tool.
func (s *Store) Schema() []string {
	b, err := schemas.ReadFile("schema/" + string(s.dialect) + ".sql")
	if err != nil {
		panic(err) // embedded at build time
	}
	var out []string
	for stmt := range strings.SplitSeq(string(b), ";") {
		var lines []string
		for line := range strings.SplitSeq(stmt, "\n") {
			if t := strings.TrimSpace(line); t != "" && !strings.HasPrefix(t, "--") {
				lines = append(lines, line)
			}
		}
		if len(lines) > 0 {
			// Index names take no schema: an index lives in its table's.
			index := s.prefix[strings.LastIndex(s.prefix, ".")+1:]
			out = append(out, strings.NewReplacer("{prefix}", s.prefix, "{index}", index).Replace(strings.Join(lines, "\n")))
		}
	}
	return append(out, s.stockRoutineDDL())
}

// pgColumns are the columns that tables made by earlier versions may
// lack, by table ("locks" or "records"): Migrate adds them.
var pgColumns = []struct{ table, name, ddl string }{
	{"records", "watched", "boolean NOT NULL DEFAULT false"},
	{"records", "attempt", "integer NOT NULL DEFAULT 0"},
	{"records", "sweep_us", "bigint NOT NULL DEFAULT 0"},
	{"locks", "queued", "boolean NOT NULL DEFAULT false"},
}

// pgColumnTable is the full name of a pgColumns table.
func (s *Store) pgColumnTable(table string) string {
	locks, _, records := s.Tables()
	if table == "locks" {
		return locks
	}
	return records
}

// Migrate creates the Store's tables and indexes where they do not exist,
// and brings tables made by earlier versions up to date. It is safe to run
// from many processes at once and again on every start, also while other
// processes use the tables, and it never stops them for long: on
// PostgreSQL a schema that is in place is found so in the catalogs,
// without a statement that locks a table; a column is added under a short
// lock_timeout (retried: it never queues every writer behind a long
// transaction), and an index is built with CREATE INDEX CONCURRENTLY,
// outside any transaction, while writers go on. On MySQL a column is
// added with ALGORITHM=INSTANT (or INPLACE) and an index with
// LOCK=NONE, under a short lock_wait_timeout. Migrate returns when every
// index is built; storage.Open (migrate=true) waits only for the tables
// and columns, and builds missing indexes in the background.
func (s *Store) Migrate(ctx context.Context) error {
	if err := s.migrateTables(ctx); err != nil {
		return err
	}
	return s.migrateIndexes(ctx)
}

// migrateInBackground is storage.Open's migration: the tables and columns
// now, the indexes (a build can take minutes on a large table) in the
// background until they are built or the Store closes; a build cut short
// is finished by the next one.
func (s *Store) migrateInBackground(ctx context.Context) error {
	if err := s.migrateTables(ctx); err != nil {
		return err
	}
	s.wg.Go(func() { _ = s.migrateIndexes(s.sctx) })
	return nil
}

// ddlLockTimeout bounds how long a schema change waits for its table's
// lock: a change queued behind a long transaction would hold up every
// writer queued behind it. It is tried again, ddlTries times in all.
const (
	ddlLockTimeout = time.Second
	ddlTries       = 5
)

// retryDDL runs f until it does not fail on a lock it could not take in
// time, ddlTries times at most, pausing in between.
func retryDDL(ctx context.Context, f func() error) error {
	var err error
	for i := range ddlTries {
		if err = f(); err == nil || !ddlLockTimedOut(err) {
			return err
		}
		t := time.NewTimer(time.Duration(i+1) * 200 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return errors.Join(err, ctx.Err())
		case <-t.C:
		}
	}
	return err
}

// ddlLockTimedOut reports a schema change that gave up waiting for its
// table's lock (PostgreSQL's lock_timeout, 55P03; MySQL's
// lock_wait_timeout, 1205).
func ddlLockTimedOut(err error) bool {
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return pg.Code == "55P03"
	}
	var my *mysql.MySQLError
	return errors.As(err, &my) && my.Number == 1205
}

// isIndexStatement reports a statement of the schema that creates or
// drops an index.
func isIndexStatement(stmt string) bool {
	t := strings.TrimSpace(stmt)
	return strings.HasPrefix(t, "CREATE INDEX") || strings.HasPrefix(t, "DROP INDEX")
}

// Layout is the layout of the tables this version makes and reads, named
// in each table's comment ("oncekit layout 1": oncekit v0.1.0's). Every
// later version reads the rows of every earlier layout; a Store refuses
// tables of a later layout than its own (CheckLayout).
const Layout = 1

// layoutComment is a table's comment naming Layout.
var layoutComment = "oncekit layout " + strconv.Itoa(Layout)

// CheckLayout reads the layout of the Store's tables (their comments) and
// returns an error matching idem.ErrUnknownLayout when one is of a later
// layout than this version reads: a later version migrated them, and this
// one must not judge their rows. Tables not made yet, and tables made
// before their layout was named, pass. Migrate checks it first, and
// storage.Open always.
func (s *Store) CheckLayout(ctx context.Context) error {
	locks, waiters, records := s.Tables()
	items, stockRecords := s.StockTables()
	names := []string{locks, waiters, records, items, stockRecords}
	var rows *sql.Rows
	var err error
	if s.dialect == Postgres {
		rows, err = s.db.QueryContext(ctx, "SELECT n, coalesce(obj_description(to_regclass(n), 'pg_class'), '') FROM unnest($1::text[]) n WHERE to_regclass(n) IS NOT NULL", pgArray(names))
	} else {
		rows, err = s.db.QueryContext(ctx, "SELECT TABLE_NAME, TABLE_COMMENT FROM information_schema.TABLES WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME IN (?, ?, ?, ?, ?)",
			schemaOf(locks), tableOf(locks), tableOf(waiters), tableOf(records), tableOf(items), tableOf(stockRecords))
	}
	if err != nil {
		return s.errWrap("check layout", "", err)
	}
	defer rows.Close()
	for rows.Next() {
		var table, comment string
		if err := rows.Scan(&table, &comment); err != nil {
			return s.errWrap("check layout", "", err)
		}
		rest, ok := strings.CutPrefix(comment, "oncekit layout ")
		if !ok {
			continue // made before the layout was named
		}
		if n, err := strconv.Atoi(rest); err != nil || n > Layout {
			return fmt.Errorf("sqlstore: table %s is of %s, this version reads layout %d: a later oncekit migrated it (upgrade this one): %w", table, comment, Layout, idem.ErrUnknownLayout)
		}
	}
	return rows.Err()
}

// migrateTables creates the tables and adds the columns of tables made
// before them.
func (s *Store) migrateTables(ctx context.Context) error {
	if err := s.CheckLayout(ctx); err != nil {
		return err
	}
	if s.dialect == Postgres {
		// One transaction under an advisory lock: concurrent CREATE ... IF
		// NOT EXISTS can otherwise collide in PostgreSQL's catalogs.
		return retryDDL(ctx, func() error {
			return s.inTx(ctx, "migrate", "", func(tx *sql.Tx) error {
				if _, err := tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock(hashtext($1))", "oncekit-migrate:"+s.prefix); err != nil {
					return err
				}
				if done, err := s.pgSchemaInPlace(ctx, tx); err != nil || done {
					if err == nil {
						err = s.pgEnsureStockFunction(ctx, tx)
					}
					return err
				}
				if _, err := tx.ExecContext(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d", ddlLockTimeout.Milliseconds())); err != nil {
					return err
				}
				// A table made before a column: added (only then, as ALTER
				// TABLE locks the table, for a moment: a column with a
				// constant default changes no row), before the schema's
				// indexes, which may name it. (A table not made yet is made
				// with it.)
				for _, col := range pgColumns {
					table := s.pgColumnTable(col.table)
					var exists, has bool
					if err := tx.QueryRowContext(ctx, "SELECT to_regclass($1) IS NOT NULL, EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass($1)"+
						" AND attname = $2 AND NOT attisdropped)", table, col.name).Scan(&exists, &has); err != nil {
						return err
					}
					if exists && !has {
						if _, err := tx.ExecContext(ctx, "ALTER TABLE "+table+" ADD COLUMN "+col.name+" "+col.ddl); err != nil {
							return err
						}
					}
				}
				for _, stmt := range s.Schema() {
					if isIndexStatement(stmt) || strings.HasPrefix(stmt, "CREATE OR REPLACE FUNCTION") {
						continue // migrateIndexes: CONCURRENTLY; the function: below
					}
					if _, err := tx.ExecContext(ctx, stmt); err != nil {
						return err
					}
				}
				return s.pgEnsureStockFunction(ctx, tx)
			})
		})
	}
	return s.myMigrateTables(ctx)
}

// pgEnsureStockFunction makes the stock function where it does not exist
// (under migrateTables' advisory lock). A later version that changes it
// names a new one (stock_apply_v2), so that both versions' Stores run
// side by side during a rolling deploy.
func (s *Store) pgEnsureStockFunction(ctx context.Context, tx *sql.Tx) error {
	var exists bool
	if err := tx.QueryRowContext(ctx, "SELECT to_regprocedure($1) IS NOT NULL", s.prefix+pgStockFunction+pgStockArgs).Scan(&exists); err != nil || exists {
		return err
	}
	_, err := tx.ExecContext(ctx, s.stockRoutineDDL())
	return err
}

// myEnsureStockProcedure makes the stock procedure where it does not
// exist (another process may make it at the same time: 1304, it exists).
func (s *Store) myEnsureStockProcedure(ctx context.Context, c *sql.Conn) error {
	var n int
	if err := c.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = COALESCE(?, DATABASE()) AND ROUTINE_NAME = ?",
		schemaOf(s.prefix+pgStockFunction), tableOf(s.prefix+pgStockFunction)).Scan(&n); err != nil || n > 0 {
		return err
	}
	_, err := c.ExecContext(ctx, s.stockRoutineDDL())
	var my *mysql.MySQLError
	if errors.As(err, &my) && my.Number == 1304 {
		return nil
	}
	return err
}

// migrateIndexes builds the schema's indexes and drops the ones it drops,
// without blocking writers: on PostgreSQL CONCURRENTLY, outside any
// transaction (an invalid index that a build cut short left behind is
// dropped and built again, unless another process is building it now).
func (s *Store) migrateIndexes(ctx context.Context) error {
	if s.dialect != Postgres {
		return s.myMigrateIndexes(ctx)
	}
	for _, stmt := range s.Schema() {
		t := strings.TrimSpace(stmt)
		var err error
		switch {
		case strings.HasPrefix(t, "DROP INDEX IF EXISTS "):
			_, err = s.db.ExecContext(ctx, "DROP INDEX CONCURRENTLY IF EXISTS "+strings.TrimPrefix(t, "DROP INDEX IF EXISTS "))
		case strings.HasPrefix(t, "CREATE INDEX IF NOT EXISTS "):
			err = s.pgBuildIndex(ctx, t)
		default:
			continue
		}
		if err != nil {
			return fmt.Errorf("sqlstore: migrate: %s: %w", t, err)
		}
	}
	return nil
}

// pgBuildIndex builds the index of stmt ("CREATE INDEX IF NOT EXISTS name
// ON table ...") concurrently, unless it is built and valid.
func (s *Store) pgBuildIndex(ctx context.Context, stmt string) error {
	m := pgSchemaStatement.FindStringSubmatch(stmt)
	if m == nil {
		return fmt.Errorf("not an index statement")
	}
	name := m[2]
	if sch, ok := schemaOf(m[3]).(string); ok {
		name = sch + "." + m[2]
	}
	for {
		// valid: built; building: another process's build is under way;
		// exists: an index by that name (invalid when not valid).
		var exists, valid, building bool
		if err := s.db.QueryRowContext(ctx, `SELECT to_regclass($1) IS NOT NULL,
			coalesce((SELECT indisvalid AND indisready FROM pg_index WHERE indexrelid = to_regclass($1)), false),
			EXISTS (SELECT 1 FROM pg_stat_progress_create_index WHERE index_relid = to_regclass($1))`, name).Scan(&exists, &valid, &building); err != nil {
			return err
		}
		switch {
		case valid:
			return nil
		case building:
			t := time.NewTimer(200 * time.Millisecond)
			select {
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			case <-t.C:
			}
			continue
		case exists: // a build cut short: invalid, and nobody finishes it
			if _, err := s.db.ExecContext(ctx, "DROP INDEX CONCURRENTLY IF EXISTS "+name); err != nil {
				return err
			}
		}
		_, err := s.db.ExecContext(ctx, strings.Replace(stmt, "CREATE INDEX IF NOT EXISTS", "CREATE INDEX CONCURRENTLY IF NOT EXISTS", 1))
		if err == nil || ctx.Err() != nil {
			return err
		}
		// Another process made it at the same moment: look again.
		var again bool
		if qerr := s.db.QueryRowContext(ctx, "SELECT to_regclass($1) IS NOT NULL", name).Scan(&again); qerr != nil || !again {
			return err
		}
	}
}

// myMigrateTables is migrateTables on MySQL.
func (s *Store) myMigrateTables(ctx context.Context) error {
	c, err := s.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("sqlstore: migrate: %w", err)
	}
	defer c.Close()
	// A change waits for its table's metadata lock at most this long (and
	// is tried again): queued behind a long transaction, it would hold up
	// every statement on the table queued behind it.
	if _, err := c.ExecContext(ctx, fmt.Sprintf("SET SESSION lock_wait_timeout = %d", int(ddlLockTimeout.Seconds()))); err != nil {
		return fmt.Errorf("sqlstore: migrate: %w", err)
	}
	defer c.ExecContext(context.WithoutCancel(ctx), "SET SESSION lock_wait_timeout = DEFAULT") //nolint:errcheck
	for _, stmt := range s.Schema() {                                                          // MySQL's DDL commits on its own
		if strings.HasPrefix(stmt, "CREATE PROCEDURE") {
			continue // myEnsureStockProcedure
		}
		if err := retryDDL(ctx, func() error { _, err := c.ExecContext(ctx, stmt); return err }); err != nil {
			return fmt.Errorf("sqlstore: migrate: %w", err)
		}
	}
	locks, _, records := s.Tables()
	// A table made before a column: added (only then), in place and at
	// once where the server can (a column at the end, with a default).
	for _, col := range []struct{ table, name, ddl string }{
		{records, "attempt", "INT NOT NULL DEFAULT 0"},
		{records, "sweep_us", "BIGINT NOT NULL DEFAULT 0"},
		{locks, "queued", "BOOLEAN NOT NULL DEFAULT FALSE"},
	} {
		var n int
		if err := c.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = COALESCE(?, DATABASE())"+
			" AND TABLE_NAME = ? AND COLUMN_NAME = ?", schemaOf(col.table), tableOf(col.table), col.name).Scan(&n); err != nil {
			return fmt.Errorf("sqlstore: migrate: %w", err)
		}
		if n > 0 {
			continue
		}
		add := "ALTER TABLE " + col.table + " ADD COLUMN " + col.name + " " + col.ddl
		err := retryDDL(ctx, func() error { _, err := c.ExecContext(ctx, add+", ALGORITHM=INSTANT"); return err })
		if myAlgorithmRefused(err) { // MySQL before 8.0.12
			err = retryDDL(ctx, func() error { _, err := c.ExecContext(ctx, add+", ALGORITHM=INPLACE, LOCK=NONE"); return err })
		}
		if err != nil && !myDuplicateColumn(err) {
			return fmt.Errorf("sqlstore: migrate: %w", err)
		}
	}
	if err := s.myEnsureStockProcedure(ctx, c); err != nil {
		return fmt.Errorf("sqlstore: migrate: %w", err)
	}
	// Tables made before their layout was named: named (their rows are of
	// it once the columns above are there).
	_, waiters, _ := s.Tables()
	for _, table := range []string{locks, waiters, records} {
		var comment string
		if err := c.QueryRowContext(ctx, "SELECT TABLE_COMMENT FROM information_schema.TABLES WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ?",
			schemaOf(table), tableOf(table)).Scan(&comment); err != nil {
			return fmt.Errorf("sqlstore: migrate: %w", err)
		}
		if comment == layoutComment {
			continue
		}
		mark := "ALTER TABLE " + table + " COMMENT = '" + layoutComment + "'"
		if err := retryDDL(ctx, func() error { _, err := c.ExecContext(ctx, mark); return err }); err != nil {
			return fmt.Errorf("sqlstore: migrate: %w", err)
		}
	}
	return nil
}

// myAlgorithmRefused reports an ALTER TABLE whose ALGORITHM the server
// does not support for it (1845/1846: ER_ALTER_OPERATION_NOT_SUPPORTED[_REASON]).
func myAlgorithmRefused(err error) bool {
	var my *mysql.MySQLError
	return errors.As(err, &my) && (my.Number == 1845 || my.Number == 1846)
}

// myMigrateIndexes adds and drops the indexes of tables made before them,
// in place, with writes going on (LOCK=NONE).
func (s *Store) myMigrateIndexes(ctx context.Context) error {
	c, err := s.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("sqlstore: migrate: %w", err)
	}
	defer c.Close()
	if _, err := c.ExecContext(ctx, fmt.Sprintf("SET SESSION lock_wait_timeout = %d", int(ddlLockTimeout.Seconds()))); err != nil {
		return fmt.Errorf("sqlstore: migrate: %w", err)
	}
	defer c.ExecContext(context.WithoutCancel(ctx), "SET SESSION lock_wait_timeout = DEFAULT") //nolint:errcheck
	locks, _, records := s.Tables()
	// Indexes of tables made before: the records' sweep index added, the
	// expiry indexes of both tables dropped (only then; MySQL 8 has no
	// IF [NOT] EXISTS for them).
	index := s.prefix[strings.LastIndex(s.prefix, ".")+1:]
	for _, ix := range []struct {
		table, name, ddl string
		want             bool
	}{
		{records, index + "records_sweep", "ADD INDEX " + index + "records_sweep (sweep_us)", true},
		{records, index + "records_expires", "DROP INDEX " + index + "records_expires", false},
		{locks, index + "locks_expires", "DROP INDEX " + index + "locks_expires", false},
	} {
		var k int
		if err := c.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = COALESCE(?, DATABASE())"+
			" AND TABLE_NAME = ? AND INDEX_NAME = ?", schemaOf(ix.table), tableOf(ix.table), ix.name).Scan(&k); err != nil {
			return fmt.Errorf("sqlstore: migrate: %w", err)
		}
		if (k > 0) == ix.want {
			continue
		}
		alter := "ALTER TABLE " + ix.table + " " + ix.ddl + ", ALGORITHM=INPLACE, LOCK=NONE"
		if err := retryDDL(ctx, func() error { _, err := c.ExecContext(ctx, alter); return err }); err != nil && !myNoSuchIndex(err) && !myDuplicateIndex(err) {
			return fmt.Errorf("sqlstore: migrate: %w", err)
		}
	}
	return nil
}

// pgSchemaStatement matches the statements of the PostgreSQL schema, which
// pgSchemaInPlace checks in the catalogs: a table or an index that must
// exist, an index that must not.
var pgSchemaStatement = regexp.MustCompile(`^(CREATE TABLE IF NOT EXISTS|CREATE INDEX IF NOT EXISTS|DROP INDEX IF EXISTS|COMMENT ON TABLE) ([\w.]+)(?: ON ([\w.]+))?`)

// pgSchemaInPlace reports whether every statement of the schema would
// change nothing and the records table has all of pgColumns, read from
// the catalogs (which lock no table). A statement it does not know
// counts as work to do.
func (s *Store) pgSchemaInPlace(ctx context.Context, tx *sql.Tx) (bool, error) {
	var exist, absent, marked []string
	for _, stmt := range s.Schema() {
		m := pgSchemaStatement.FindStringSubmatch(strings.TrimSpace(stmt))
		switch {
		case strings.HasPrefix(stmt, "CREATE OR REPLACE FUNCTION"):
			continue // pgEnsureStockFunction
		case m == nil:
			return false, nil
		case m[1] == "COMMENT ON TABLE":
			marked = append(marked, m[2])
		case m[1] == "DROP INDEX IF EXISTS":
			absent = append(absent, m[2])
		case m[3] != "": // an index lives in its table's schema
			if sch, ok := schemaOf(m[3]).(string); ok {
				exist = append(exist, sch+"."+m[2])
			} else {
				exist = append(exist, m[2])
			}
		default:
			exist = append(exist, m[2])
		}
	}
	var tables, cols []string
	for _, c := range pgColumns {
		tables, cols = append(tables, s.pgColumnTable(c.table)), append(cols, c.name)
	}
	var done bool
	err := tx.QueryRowContext(ctx, `SELECT (SELECT bool_and(to_regclass(n) IS NOT NULL) FROM unnest($1::text[]) n)
		AND (SELECT coalesce(bool_and(to_regclass(n) IS NULL), true) FROM unnest($2::text[]) n)
		AND (SELECT count(*) FROM unnest($3::text[], $4::text[]) c(t, n)
			WHERE EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass(c.t) AND attname = c.n AND NOT attisdropped)) = cardinality($4::text[])
		AND (SELECT coalesce(bool_and(obj_description(to_regclass(n), 'pg_class') IS NOT DISTINCT FROM $5), true) FROM unnest($6::text[]) n)`,
		pgArray(exist), pgArray(absent), pgArray(tables), pgArray(cols), layoutComment, pgArray(marked)).Scan(&done)
	return done, err
}

// pgArray is a PostgreSQL text[] literal of names (letters, digits, '_'
// and '.': nothing to quote).
func pgArray(names []string) string { return "{" + strings.Join(names, ",") + "}" }

// schemaOf is the schema of a "schema.table" name, or nil (the
// connection's); tableOf its table.
func schemaOf(name string) any {
	if i := strings.LastIndex(name, "."); i >= 0 {
		return name[:i]
	}
	return nil
}

func tableOf(name string) string { return name[strings.LastIndex(name, ".")+1:] }
