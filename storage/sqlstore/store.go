package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/observe"
	"github.com/oncekit/oncekit/storage/internal/keep"
)

// Store is the SQL driver: locks (lock.Locker) and idempotency records
// (idemdriver.Store, idemdriver.EffectStore) in three tables of one database. Make it
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
	err := s.retry(ctx, func() error { return s.tryTx(ctx, f) })
	if err == nil {
		return nil
	}
	var st stopErr
	if errors.As(err, &st) {
		return st.err
	}
	return s.errWrap(op, key, err)
}

// retry runs f again (a few times, after a short random pause) when it
// fails in a way a new attempt may not: a deadlock, a serialization
// failure.
func (s *Store) retry(ctx context.Context, f func() error) error {
	for attempt := 0; ; attempt++ {
		err := f()
		if err == nil || !retryable(err) || attempt >= 4 || ctx.Err() != nil {
			return err
		}
		time.Sleep(time.Duration(rand.Int64N(int64(2*time.Millisecond) << attempt)))
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
