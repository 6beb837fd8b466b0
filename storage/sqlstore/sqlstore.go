package sqlstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"embed"
	"errors"
	"fmt"
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/observe"
	"github.com/oncekit/oncekit/storage/internal/keep"
)

//go:embed schema/*.sql
var schemas embed.FS

// Store is the SQL driver: locks (lock.Locker) and idempotency records
// (idem.Store, idem.EffectStore) in three tables of one database. Make it
// with New or Open; apply the schema once with Migrate.
type Store struct {
	connIDs     sync.Map     // MySQL: driver connection -> CONNECTION_ID() (myConnID)
	connIDCount atomic.Int64 // entries stored in connIDs since it was last cleared
	myText      atomic.Bool  // MySQL: db's connections keep no statements (not OpenDB's: see myConn)
	retention   atomic.Int64 // µs: the retention of the Store's last completion (0: none yet; see sweepAfter)
	db          *sql.DB
	ownsDB      bool // Open made db: Close closes it
	dialect     Dialect
	prefix      string
	q           queries

	observer        observe.Observer
	pollInterval    time.Duration
	waiterTTL       time.Duration
	cleanupInterval time.Duration
	cleanupBatch    int
	maxResult       int
	onCleanupError  func(error)
	listen          bool
	pgx             bool          // db's driver is pgx's stdlib: queryRow goes through pgx itself
	myReturning     atomic.Int32  // MySQL: 0 not asked yet, 1 the server takes INSERT ... RETURNING, 2 not (Store.returning)
	asking          chan struct{} // (Store.returning: one question at a time)
	noReturning     bool          // (tests: the path without RETURNING, as on MySQL 8)
	replays         atomic.Int64  // whether recent Begins found their key held (Store.seen)
	cleanups        atomic.Int64  // the cleanup loop's runs (tests)
	noNotify        bool          // WithoutNotify
	noBatch         bool          // (tests: every claim and completion alone)
	handOffs        keep.HandOffs // WithMaxLocalHandOffs, WithMaxLocalHold

	// Claims of new keys and completions sent while others are in flight
	// share statements (batch.go); nil: each goes alone.
	begins    *batcher[beginArg, beginRes]
	completes *batcher[completeArg, bool]
	reads     *batcher[[]byte, recordRow]

	hub *hub

	// sessionQueue: waiters queue for the server's session locks (see
	// queue.go); PostgreSQL on a session of its own.
	sessionQueue bool
	slots        chan struct{}   // connections the queue may keep (takeSlot); nil: no bound
	hot          hotKeys         // keys found taken lately (acquireQueued)
	gates        gates           // one acquisition of a key waits in the database at a time (Acquire)
	local        localClaims     // the claims this Store holds in flight (local.go)
	sctx         context.Context // ends when the Store closes
	scancel      context.CancelFunc

	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup

	openMu  sync.Mutex     // guards closing and the Add of open
	closing bool           // Close was called: holdOpen says no
	open    sync.WaitGroup // statements Close waits for before it closes the database (holdOpen)
}

// Defaults of the options.
const (
	DefaultTablePrefix      = "oncekit_"
	DefaultPollInterval     = 50 * time.Millisecond
	DefaultCleanupInterval  = time.Minute
	DefaultCleanupBatch     = 500
	DefaultMaxResultBytes   = 1 << 20
	DefaultMaxLocalHandOffs = 16
	DefaultMaxLocalHold     = time.Millisecond
)

// waiterTTL is how long a queued waiter keeps its place without asking
// again: a waiter that died frees its place (and a free key it was first
// in line for) within it.
const defaultWaiterTTL = 3 * time.Second

// Option configures a Store.
type Option func(*Store)

// WithDialect names the SQL dialect when New cannot tell it from the
// database/sql driver (pgx's stdlib and go-sql-driver/mysql are
// recognised).
func WithDialect(d Dialect) Option { return func(s *Store) { s.dialect = d } }

// WithTablePrefix sets the prefix of the Store's three tables (<prefix>locks,
// <prefix>lock_waiters, <prefix>records): letters, digits and underscores,
// optionally after a schema ("app.oncekit_"). Default "oncekit_".
func WithTablePrefix(p string) Option { return func(s *Store) { s.prefix = p } }

// WithMaxLocalHandOffs and WithMaxLocalHold bound how long a key is
// handed from one lease of this Store straight to the next Acquire of it
// waiting in this Store, without a release and a take through the
// database, before it is released so that other processes can take it: n
// hand-offs in a row, or as many as start within d after the Store took
// the key, whichever is more. The first hand-off of a take costs one
// statement (it renews the key's row and reserves the next fences), the
// next ones none while the row has more than 7/8 of the next lease's TTL
// left; each lease still gets a higher fence, and every fence issued
// later is above them. Leases taken with lock.WithOwner are not handed
// on. n = 0 turns hand-offs off. Defaults 16 and 1 ms (as redisstore's).
func WithMaxLocalHandOffs(n int) Option { return func(s *Store) { s.handOffs.Max = n } }

// WithMaxLocalHold: see WithMaxLocalHandOffs.
func WithMaxLocalHold(d time.Duration) Option { return func(s *Store) { s.handOffs.Hold = d } }

// WithObserver sets where the Store, and the lock.Mutex and idem.Guard
// built on it, report their operations (see package observe).
func WithObserver(o observe.Observer) Option { return func(s *Store) { s.observer = o } }

// WithoutNotify makes the Store keep no state in a database session
// between statements: no LISTEN for notifications and no session lock
// (pg_advisory_lock, GET_LOCK) to queue a lock's waiters in the server.
// Waiters then queue in the lock_waiters table and poll (see
// WithPollInterval). For a connection pooler in transaction mode
// (pgbouncer's pool_mode = transaction), which keeps no session. Open and
// storage.Open take it as notify=false in the URL.
func WithoutNotify() Option { return func(s *Store) { s.noNotify = true } }

// WithPollInterval bounds how long a waiter sleeps between two looks at a
// held key (or an in-flight record) when nothing wakes it: on MySQL, which
// has no notifications, this is the hand-off latency, and each waiting
// process asks the database about 1/interval times a second (starting at
// 2 ms and doubling, with jitter). On PostgreSQL with pgx, waiters are
// woken by NOTIFY and only fall back to it. Default 50 ms.
func WithPollInterval(d time.Duration) Option { return func(s *Store) { s.pollInterval = d } }

// WithCleanup sets how often the Store deletes expired rows (released
// locks whose fence the clock has passed, records past their retention,
// dead waiters), and how many rows one DELETE removes at most: small
// batches keep row locks short. Of the Stores on the same tables, one
// cleans per interval (they take turns by a lock of their own). An
// interval of 0 turns the loop off (call Cleanup yourself, from one
// process or many). Default every minute, 500 rows per statement.
func WithCleanup(interval time.Duration, batch int) Option {
	return func(s *Store) { s.cleanupInterval, s.cleanupBatch = interval, batch }
}

// WithCleanupErrors sets a function that gets each error of the cleanup
// loop (the loop tries again at its next tick). Default: none.
func WithCleanupErrors(f func(error)) Option { return func(s *Store) { s.onCleanupError = f } }

// WithMaxResultBytes bounds a stored result; a larger one is refused with
// idem.ErrResultTooLarge before anything is written. Default 1 MiB.
func WithMaxResultBytes(n int) Option { return func(s *Store) { s.maxResult = n } }

// New returns a Store over db. db stays the caller's: Close does not close
// it. The dialect is taken from db's driver unless WithDialect names it.
// New does not touch the database; call Migrate once to create the tables.
func New(db *sql.DB, opts ...Option) (*Store, error) {
	if db == nil {
		return nil, errors.New("sqlstore: nil *sql.DB")
	}
	s := &Store{
		db: db, prefix: DefaultTablePrefix, pollInterval: DefaultPollInterval, waiterTTL: defaultWaiterTTL,
		cleanupInterval: DefaultCleanupInterval, cleanupBatch: DefaultCleanupBatch, maxResult: DefaultMaxResultBytes,
		stop: make(chan struct{}), asking: make(chan struct{}, 1), handOffs: keep.HandOffs{Max: DefaultMaxLocalHandOffs, Hold: DefaultMaxLocalHold},
	}
	for _, o := range opts {
		o(s)
	}
	if s.dialect == "" {
		switch db.Driver().(type) {
		case *stdlib.Driver:
			s.dialect = Postgres
		case *mysql.MySQLDriver:
			s.dialect = MySQL
		default:
			return nil, fmt.Errorf("sqlstore: cannot tell the dialect of driver %T: pass WithDialect", db.Driver())
		}
	}
	switch {
	case s.dialect != Postgres && s.dialect != MySQL:
		return nil, fmt.Errorf("sqlstore: unknown dialect %q (want %q or %q)", s.dialect, Postgres, MySQL)
	case s.pollInterval <= 0:
		return nil, fmt.Errorf("sqlstore: poll interval %s is not positive", s.pollInterval)
	case s.cleanupInterval < 0 || s.cleanupBatch <= 0:
		return nil, fmt.Errorf("sqlstore: cleanup every %s by %d rows: want an interval >= 0 and a positive batch", s.cleanupInterval, s.cleanupBatch)
	case s.maxResult <= 0:
		return nil, fmt.Errorf("sqlstore: max result %d bytes is not positive", s.maxResult)
	case s.handOffs.Max < 0 || s.handOffs.Hold < 0:
		return nil, fmt.Errorf("sqlstore: %d local hand-offs, or a local hold of %s: want neither negative", s.handOffs.Max, s.handOffs.Hold)
	}
	if err := validPrefix(s.prefix); err != nil {
		return nil, err
	}
	s.q = newQueries(s.dialect, s.prefix)
	_, s.pgx = db.Driver().(*stdlib.Driver)
	s.listen = s.dialect == Postgres && s.pgx && !s.noNotify
	s.sessionQueue = !s.noNotify
	if s.dialect == Postgres && s.pgx && !s.noBatch {
		s.begins = &batcher[beginArg, beginRes]{s: s, one: s.leanBeginOne, many: s.leanBeginMany,
			size: func(a beginArg) int { return len(a.key) + len(a.fp) + len(a.tok) }}
		s.completes = &batcher[completeArg, bool]{s: s, one: s.fastCompleteOne, many: s.fastCompleteMany,
			size: func(a completeArg) int { return len(a.key) + len(a.tok) + len(a.result) }}
		s.reads = &batcher[[]byte, recordRow]{s: s, one: s.recordOne, many: s.recordMany,
			size: func(key []byte) int { return len(key) }}
	}
	if n := db.Stats().MaxOpenConnections; n > 0 {
		s.slots = make(chan struct{}, max(n/2, 1))
	}
	s.sctx, s.scancel = context.WithCancel(context.Background())
	s.hub = newHub()
	if s.listen {
		s.wg.Go(s.listenLoop)
	}
	if s.cleanupInterval > 0 {
		s.wg.Go(s.cleanupLoop)
	}
	return s, nil
}

// Close stops the Store's background work (the LISTEN connection, the
// cleanup loop) and, for a Store made by Open, closes its database. After
// it, Acquire, TryAcquire, Begin and WaitChange fail with an error
// matching lock.ErrClosed, and Acquires waiting for a key give up with it.
// Leases and claims still held expire in the database by their TTL (a
// Store over a database it does not own can still release them). Close
// is idempotent.
func (s *Store) Close() error {
	s.stopOnce.Do(func() {
		close(s.stop)
		s.openMu.Lock()
		s.closing = true
		s.openMu.Unlock()
		s.scancel()
	})
	s.wg.Wait()
	s.open.Wait()
	s.hub.wakeAll()
	if s.ownsDB {
		return s.db.Close()
	}
	return nil
}

// holdOpen keeps the database open until done is called, for a
// statement that Close ends through the database itself (a MySQL wait
// ended by KILL QUERY, sent on another of its connections): Close waits
// for it before it closes the database. ok is false after Close.
func (s *Store) holdOpen() (done func(), ok bool) {
	s.openMu.Lock()
	defer s.openMu.Unlock()
	if s.closing {
		return nil, false
	}
	s.open.Add(1)
	return s.open.Done, true
}

// closed reports whether Close was called.
func (s *Store) closed() bool {
	select {
	case <-s.stop:
		return true
	default:
		return false
	}
}

// closedErr reports a call op on key after Close (lock.ErrClosed), nil
// before.
func (s *Store) closedErr(op, key string) error {
	if !s.closed() {
		return nil
	}
	return fmt.Errorf("sqlstore: %s %q: %w", op, key, lock.ErrClosed)
}

// DB returns the database the Store works on.
func (s *Store) DB() *sql.DB { return s.db }

// Dialect returns the Store's SQL dialect.
func (s *Store) Dialect() Dialect { return s.dialect }

// DriverName implements observe.Source: "postgres" or "mysql".
func (s *Store) DriverName() string { return string(s.dialect) }

// Observer implements observe.Source.
func (s *Store) Observer() observe.Observer { return s.observer }

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
	return out
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
	names := []string{locks, waiters, records}
	var rows *sql.Rows
	var err error
	if s.dialect == Postgres {
		rows, err = s.db.QueryContext(ctx, "SELECT n, coalesce(obj_description(to_regclass(n), 'pg_class'), '') FROM unnest($1::text[]) n WHERE to_regclass(n) IS NOT NULL", pgArray(names))
	} else {
		rows, err = s.db.QueryContext(ctx, "SELECT TABLE_NAME, TABLE_COMMENT FROM information_schema.TABLES WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME IN (?, ?, ?)",
			schemaOf(locks), tableOf(locks), tableOf(waiters), tableOf(records))
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
					if isIndexStatement(stmt) {
						continue // migrateIndexes: CONCURRENTLY
					}
					if _, err := tx.ExecContext(ctx, stmt); err != nil {
						return err
					}
				}
				return nil
			})
		})
	}
	return s.myMigrateTables(ctx)
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

// errWrap names the driver, the operation and the key, and says what to do
// about a missing table.
func (s *Store) errWrap(op, key string, err error) error {
	what := op
	if key != "" { // (Migrate has none)
		what = fmt.Sprintf("%s %q", op, key)
	}
	switch {
	case s.closed():
		return fmt.Errorf("sqlstore: %s: %w (%w)", what, lock.ErrClosed, err)
	case missingTable(err):
		return fmt.Errorf("sqlstore: %s: %w (run Store.Migrate to create the tables)", what, err)
	case connectionLost(err):
		return fmt.Errorf("sqlstore: %s: no answer from the database (the connection failed or was cut; a statement already sent may have run): %w", what, err)
	}
	return fmt.Errorf("sqlstore: %s: %w", what, err)
}

// inTx runs f in a transaction and commits it, running it again (up to
// four times) when the server aborted it to break a deadlock. f's error
// rolls the transaction back and is returned as it is when it is one of
// the Store's own (errStop); database errors are wrapped.
func (s *Store) inTx(ctx context.Context, op, key string, f func(tx *sql.Tx) error) error {
	for attempt := 0; ; attempt++ {
		err := s.tryTx(ctx, f)
		if err == nil {
			return nil
		}
		var st stopErr
		if errors.As(err, &st) {
			return st.err
		}
		if retryable(err) && attempt < 4 && ctx.Err() == nil {
			time.Sleep(time.Duration(rand.Int64N(int64(2*time.Millisecond) << attempt)))
			continue
		}
		return s.errWrap(op, key, err)
	}
}

// ownTx is the isolation of the Store's own transactions: READ COMMITTED
// on PostgreSQL, whatever the server's or the session's default (at
// REPEATABLE READ or SERIALIZABLE, the row it updates after another
// transaction did fails with a serialization error every time the key is
// contended); MySQL's default, whose locking reads see the latest rows.
func (s *Store) ownTx() *sql.TxOptions {
	if s.dialect == Postgres {
		return &sql.TxOptions{Isolation: sql.LevelReadCommitted}
	}
	return nil
}

func (s *Store) tryTx(ctx context.Context, f func(tx *sql.Tx) error) error {
	tx, err := s.db.BeginTx(ctx, s.ownTx())
	if err != nil {
		return err
	}
	if err := f(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// stopErr carries an outcome of the Store's own (a lost lease, a busy key)
// out of a transaction, which is rolled back.
type stopErr struct{ err error }

func (e stopErr) Error() string { return e.err.Error() }

func stop(err error) error { return stopErr{err} }

// notifyTx wakes, on PostgreSQL, the waiters of a record in every process
// when tx commits, if one marked it watched (tx holds the row's lock: a
// duplicate's mark either came first or finds the record finished).
func (s *Store) notifyTx(ctx context.Context, tx *sql.Tx, channel, key string) error {
	if s.dialect != Postgres {
		return nil
	}
	_, err := tx.ExecContext(ctx, s.q.notify, channel, keyHash(key), []byte(key))
	return err
}

// notifyHead finds the first live waiter of a lock in tx and, on
// PostgreSQL, notifies it when tx commits (one statement). It returns the
// waiter, for the caller to wake in this process after the commit, or "".
func (s *Store) notifyHead(ctx context.Context, tx *sql.Tx, key string) (string, error) {
	var head string
	var err error
	if s.dialect == Postgres {
		locks, _, _ := s.Tables()
		err = tx.QueryRowContext(ctx, s.q.notifyHead, locks, []byte(key)).Scan(&head, new(string))
	} else {
		err = tx.QueryRowContext(ctx, s.q.queueHeadNow, []byte(key)).Scan(&head)
	}
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	return head, err
}

// Cleanup deletes expired rows in batches (see WithCleanup) until a batch
// comes back short, and returns how many it deleted. Rows are deleted
// only once the server's clock has passed their fence, so a fence never
// goes backwards.
func (s *Store) Cleanup(ctx context.Context) (int64, error) {
	var total int64
	for i, stmt := range s.q.cleanup {
		for {
			res, err := s.cleanupStep(ctx, stmt)
			if err != nil {
				return total, s.errWrap("cleanup", "", err)
			}
			n, _ := res.RowsAffected()
			if i != 2 { // (the records' sweep_us set again, not deleted)
				total += n
			}
			if n < int64(s.cleanupBatch) {
				break
			}
		}
	}
	return total, nil
}

// cleanupStep runs one batch of a cleanup statement. MySQL's locks table
// has no index on its expiry, and a DELETE that scans it locks every row
// it passes (at REPEATABLE READ until it ends; READ COMMITTED does not
// spare a DELETE) and waits for any another statement holds: there the
// batch's keys are found by a read that takes no lock, and deleted by
// key, each row's expiry and fence checked again as the DELETE locks it.
// (PostgreSQL's statements skip locked rows: FOR UPDATE SKIP LOCKED.)
func (s *Store) cleanupStep(ctx context.Context, stmt string) (sql.Result, error) {
	if s.dialect != MySQL || stmt != s.q.cleanup[0] {
		return s.db.ExecContext(ctx, stmt, s.cleanupBatch)
	}
	rows, err := s.db.QueryContext(ctx, s.q.cleanupPick, s.cleanupBatch)
	if err != nil {
		return nil, err
	}
	var keys []any
	for rows.Next() {
		var k []byte
		if err := rows.Scan(&k); err != nil {
			_ = rows.Close()
			return nil, err
		}
		keys = append(keys, k)
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return nil, err
	}
	if len(keys) == 0 {
		return driver.RowsAffected(0), nil
	}
	res, err := s.db.ExecContext(ctx, s.q.cleanupByKey+" AND lock_key IN (?"+strings.Repeat(", ?", len(keys)-1)+")", keys...)
	if err != nil {
		return nil, err
	}
	if n, _ := res.RowsAffected(); n < int64(len(keys)) && len(keys) == s.cleanupBatch {
		// Rows taken meanwhile: a full batch still asks for the next one.
		return driver.RowsAffected(s.cleanupBatch), nil
	}
	return res, nil
}

// cleanupKey is the lock the cleanup loops of the Stores sharing the
// tables take in turn (its leading NUL keeps it apart from the keys
// applications choose, in practice).
const cleanupKey = "\x00oncekit:cleanup"

func (s *Store) cleanupLoop() {
	t := time.NewTicker(s.cleanupInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), s.cleanupInterval)
		var err error
		if ran, cerr := s.cleanupTurn(ctx); cerr != nil {
			err = cerr
		} else if ran {
			s.cleanups.Add(1)
			_, err = s.Cleanup(ctx)
		}
		cancel()
		if err != nil && s.onCleanupError != nil {
			s.onCleanupError(err)
		}
	}
}

// cleanupTurn takes the cleanup's turn for most of an interval, if no
// other Store on the tables took it: of the loops of N replicas, one
// cleans per interval rather than N (each a scan of the locks table).
// The turn is a lock on cleanupKey that is never released, only left to
// expire; it keeps no connection (not the server queue's statements).
func (s *Store) cleanupTurn(ctx context.Context) (bool, error) {
	g, err := s.attempt(ctx, cleanupKey, s.cleanupInterval*9/10, "", "", false)
	if err != nil {
		return false, err
	}
	return g.token != "", nil
}

// Ping is a health check for readiness probes: the database answers on a
// connection of the pool.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.db.PingContext(ctx); err != nil {
		return fmt.Errorf("sqlstore: ping: %w", err)
	}
	return nil
}

// returning reports whether the MySQL server takes INSERT ... RETURNING
// (MariaDB 10.5 and later; MySQL 8 does not), asking it once: SELECT
// VERSION(). One caller asks at a time (the first Begins of a busy
// service all come at once); a failed question is asked again next time,
// and answers false meanwhile.
func (s *Store) returning(ctx context.Context) bool {
	if s.noReturning {
		return false
	}
	switch s.myReturning.Load() {
	case 1:
		return true
	case 2:
		return false
	}
	select {
	case s.asking <- struct{}{}:
		defer func() { <-s.asking }()
	case <-ctx.Done():
		return false
	}
	switch s.myReturning.Load() { // (answered while we waited)
	case 1:
		return true
	case 2:
		return false
	}
	var v string
	if err := s.db.QueryRowContext(ctx, "SELECT VERSION()").Scan(&v); err != nil {
		return false
	}
	if !returningVersion(v) {
		s.myReturning.Store(2)
		return false
	}
	s.myReturning.Store(1)
	return true
}

// returningVersion reports whether a server of VERSION() v is MariaDB
// 10.5 or later, e.g. "10.11.6-MariaDB-0+deb12u1".
func returningVersion(v string) bool {
	if !strings.Contains(v, "MariaDB") {
		return false
	}
	v = strings.TrimPrefix(v, "5.5.5-") // the prefix older clients were given
	var major, minor int
	if _, err := fmt.Sscanf(v, "%d.%d", &major, &minor); err != nil {
		return false
	}
	return major > 10 || major == 10 && minor >= 5
}
