// Package sqlstore is the driver for PostgreSQL and MySQL/MariaDB, over
// database/sql: locks (lock.Locker, with owners and lockdriver.Inspector) and
// idempotency records (idemdriver.Store, idemdriver.EffectStore) in three tables of
// the database the application already keeps its orders in — so that the
// record, the business writes and the outbox row can commit in one
// transaction, which no Redis can give.
//
//	db, err := sql.Open("pgx", "postgres://app@db:5432/shop") // or go-sql-driver/mysql
//	store, err := sqlstore.New(db)
//	err = store.Migrate(ctx) // once: CREATE TABLE IF NOT EXISTS ...
//	defer store.Close()
//
// or, owning its database, sqlstore.Open(ctx, "postgres://…") (also
// storage.Open, which migrates unless migrate=false). Schema returns the
// statements for users who apply migrations with their own tool; the
// tables are <prefix>locks, <prefix>lock_waiters and <prefix>records
// (WithTablePrefix, default "oncekit_"), each naming its layout in its
// comment ("oncekit layout 1"; a Store refuses tables of a later layout:
// CheckLayout).
//
// Migrate is safe on a live deployment: it adds columns under a short lock
// timeout and builds indexes without blocking writers (PostgreSQL's
// CREATE INDEX CONCURRENTLY; MySQL's LOCK=NONE), so other replicas keep
// claiming keys while the first upgraded one migrates. storage.Open waits
// for tables and columns and builds missing indexes in the background.
// Users applying Schema with their own tool on a large live table should
// build its indexes CONCURRENTLY themselves.
//
// How it works inside — locks, advisory locks: the queue, not the lock,
// idempotency records, concurrent requests share statements (postgresql),
// expiry and cleanup — is in docs/drivers.md, "How sqlstore works"
// (https://github.com/oncekit/oncekit/blob/main/docs/drivers.md#how-sqlstore-works).
//
// # Effects in the caller's transaction
//
// A Guard run attaches a sqlstore.Effect, func(ctx, *sql.Tx) error, with
// idem.Commit: the Store runs the effect and completes the record in one
// transaction, whose last statement checks that the claim is still the
// run's (the record's row locked until the commit) as it completes the
// record. A process killed anywhere in it leaves nothing committed,
// and the retry runs again; a claim lost meanwhile rolls everything back
// (lock.ErrLockLost). When the application's framework owns the
// transaction, idem.Commit(ctx, sqlstore.InTx(tx)) completes the record in
// it instead — the caller commits after Guard.Do returns — and
// Store.CompleteInTx does the same for code that calls Begin itself. Not
// under httpmw, grpcmw, kafkamw or job.Run, which answer when Guard.Do returns,
// before that commit: there Commit refuses InTx (idem.ErrCallerCommits),
// and sqlstore.Effect is the way. A caller's transaction must run at READ
// COMMITTED: at REPEATABLE READ or SERIALIZABLE it cannot complete a
// claim the watchdog extended after its snapshot (CompleteInTx says so).
//
// sqlstore.Writes is an effect made of INSERT, UPDATE and DELETE
// statements (a write with Refuse set must change a row, or the effect is
// refused and nothing is written): on PostgreSQL the Store sends them and
// the record's completion as one statement, in autocommit, so that a row
// every request writes (a SKU's stock) is locked only while that
// statement runs, never across a round trip to the client — in a flash
// sale the row's lock is what every sale waits for. On MariaDB the
// transaction, the completion and the writes are one compound statement
// (BEGIN NOT ATOMIC … END), one round trip, for the same reason; on
// MySQL 8, which has no compound statements outside stored programs,
// they run one after another in the completing transaction. A write's query takes ? placeholders on
// both databases (Dialect.Rebind numbers them for PostgreSQL, leaving a ?
// inside a literal or a comment alone; ?? is PostgreSQL's ? operator).
//
// Pool sizing with InTx: while a run's transaction holds one of the
// pool's connections, the Guard's Begin, Extend and Complete need
// another. With as many concurrent runs as the pool has connections
// (sql.DB.SetMaxOpenConns), every Extend waits for a connection until its
// lease runs out and every run is cut off: give the pool at least twice
// the concurrent runs, or give the Store a pool of its own (New with a
// second *sql.DB on the same database). sqlstore.Effect needs one
// connection per run.
//
// # Connections
//
// On MySQL, use the DSN that Open builds (or set the same yourself):
// interpolateParams=true, one round trip per statement instead of three
// for a server-side prepared statement, and time_zone='+00:00', so that
// the server's clock reads the same in every session. A *sql.DB from
// Open or OpenDB also keeps the Store's own statements prepared on each
// of its connections (prepared the first time a connection runs one,
// closed with the connection): the server parses them once, not on every
// run (BENCHMARKS.md has the figures). A *sql.DB from sql.Open works the
// same, its statements sent as text. The Store uses the
// server's default isolation level: every decision rests on rows it has
// locked, which every level reads as committed.
//
// A new connection costs the server a session (on PostgreSQL a process,
// about 2 ms of CPU) and the Store a preparation of each statement it
// runs there. database/sql opens connections as traffic asks for them, so
// a burst that finds the service idle — a flash sale's first second —
// pays for them on its critical path. Store.Warm opens them ahead, with
// the Store's common statements prepared: a service calls it once at
// start, before it reports ready (the inventory example's three-replica
// lock-free sale on PostgreSQL: about 10 % more orders a second and a
// lower p99, BENCHMARKS.md).
//
// A statement that gets no answer — no connection could be made, or the
// server crashed or restarted while it was sent — fails with an error that
// says "no answer from the database" and wraps the driver's. It is not
// sent again: it may have run. (database/sql already retries, on a new
// connection, a statement the driver knows was never sent.) The Guard
// retries a completion for as long as its claim is valid.
//
// # Behind pgbouncer
//
// In transaction pooling mode (pool_mode = transaction) a connection
// pooler keeps no session state between transactions: no LISTEN, no
// named prepared statements, no session advisory locks. Every operation
// here is one statement or one transaction, so both suites pass through
// it with two settings in the URL:
//
//	postgres://user@pgbouncer:6432/db?notify=false&default_query_exec_mode=exec
//
// notify=false (WithoutNotify) keeps no session state: no LISTEN and no
// session locks, so waiters queue in <prefix>lock_waiters and poll, the
// first every WithPollInterval/10 (5 ms): a hand-off takes a few
// milliseconds instead of a fraction of one.
// default_query_exec_mode=exec is pgx's: unnamed statements, one round
// trip each. Without notify=false, LISTEN runs on whichever server
// connection the pooler lends for that one statement, and the
// notifications go astray: waiters then wait up to a second per look
// (the conformance suites time out). Session pooling (pool_mode =
// session) needs neither setting.
package sqlstore
