// Package sqlstore is the driver for PostgreSQL and MySQL/MariaDB, over
// database/sql: locks (lock.Locker, with owners and lock.Inspector) and
// idempotency records (idem.Store, idem.EffectStore) in three tables of
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
// # Effects in the caller's transaction
//
// A Guard run attaches a sqlstore.Effect, func(ctx, *sql.Tx) error, with
// idem.Commit: the Store runs the effect and completes the record in one
// transaction, whose last statement checks that the claim is still the
// run's (the record's row locked until the commit) as it completes the
// record. A process killed anywhere in it leaves nothing committed,
// and the retry runs again; a claim lost meanwhile rolls everything back
// (idem.ErrLockLost). When the application's framework owns the
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
// # Locks
//
// A lock is a row: the holder's token, its owner and hold count, the
// fence of the latest acquisition and the expiry, all by the database
// server's clock (microseconds since the epoch, clock_timestamp() on
// PostgreSQL, UTC_TIMESTAMP(6) on MySQL, whatever the session's time zone), never a client's. The row's lock
// serialises everything about one key and nothing else. An expired row is taken over by the next acquirer; the fence is
// max(last fence + 1, the server's clock in µs), and a released key's row
// is deleted only once the clock has passed its fence, so fences never go
// backwards for a key — also across the row's deletion and a restart, as
// long as the server's clock does not step back (free rows stay until the
// cleanup, a minute past their fence: a statement that read the clock
// before it got a row's lock must never find the row gone). The common
// cases are one statement each, in one round trip: taking a key that is
// free (also Acquire's first look, which queues when it is not), a waiter
// taking the key it was queued for, releasing the last hold, claiming a free
// record and completing it (on MySQL 8 a claim reads first: two), and
// answering a duplicate or a replay (a read without locks). On pgx these
// statements go through the pool's pgx connection itself rather than
// database/sql's rows, which would start a goroutine per query under a
// context that can end. Everything else
// (re-entry, a held key, a refresh, an effect) is a transaction that locks
// the row first.
//
// Waiters queue in the database server itself. On its own session (the
// default; not behind a transaction-mode pooler, see below) a lock is two
// things: its row, which alone decides who holds the key, and a session
// lock — pg_advisory_lock of a 64-bit hash of the table and the key on
// PostgreSQL, GET_LOCK on MySQL — that the holder's connection keeps
// while it holds the row. A waiter asks for the session lock, with a
// timeout, and for the row in one statement; the server queues the
// waiters in order, and a release (the row freed and the session lock
// given back, one statement) lets the next waiter's statement go on and
// take the row: no notification, no poll, no second round trip. A lock
// cycle on a new key is two statements, and so is a hand-off on a hot
// key. Of one Store's acquisitions of a key, one at a time waits in the
// database, and none while the Store holds the key; the others wait for
// their turn in the process, in order, so that a crowd of requests for
// one key costs the server one queued session per process. A release
// while some of them wait hands the key straight to the first, as the
// Redis and etcd drivers do: the key's row keeps the Store's token, the
// first hand-off renews the row's expiry and raises its fence by 128 in
// one statement, and the next ones take those fences with no statement at
// all, each lease's fence above the last, every fence issued later above
// them. After WithMaxLocalHandOffs hand-offs or WithMaxLocalHold (16 and
// 1 ms by default), the key is released so that other processes get their
// turn. Leases taken with lock.WithOwner are not handed on. A key the Store has not found taken lately is
// first tried without waiting (on MySQL, a key it has not met lately by
// a plain insert). The session lock is only the queue, never the truth:
//
//   - a waiter's wait is bounded by the holder's expiry, and a row that
//     has been free or expired for a second while the session lock stays
//     taken is taken without it — a holder that froze with its
//     connection open delays the queue by its TTL plus a second at most;
//     a holder that crashed gives the session lock back with its
//     connection;
//   - a lease that ends without a release (its deadline passed, its key
//     was lost, it was forgotten) closes its connection, which gives the
//     session lock back; after ForceRelease the next acquirer takes the
//     row at once;
//   - the row's token, fence and expiry are checked and written exactly
//     as they would be without the queue, so two holders are impossible
//     whatever the session locks say.
//
// Each held lock and each waiter keeps one of the pool's connections, as
// pg_advisory_lock does, but never more than half of a bounded pool
// (sql.DB.SetMaxOpenConns as set when New runs; 8 of Open's 16), so
// that the holders' own statements always find a connection. An
// acquisition beyond that queues
// in <prefix>lock_waiters instead (and marks the key's row, queued, so
// that the server queue's statements look there): the longest-queued
// live waiter gets a freed key, woken by NOTIFY on PostgreSQL with pgx, looking again every
// WithPollInterval/10 (5 ms) on MySQL; every waiter there renews its place
// once a second, and a dead one keeps its place for three seconds at most.
// A waiter whose database crashes or restarts asks again for up to three
// seconds, and takes the key in its turn instead of failing. InspectLock's
// Waiters counts both kinds on PostgreSQL, and the table's on MySQL (which
// has no view of GET_LOCK's queue). A waiter whose caller gives up leaves
// the server's queue at once: PostgreSQL gets a cancel request, and
// MariaDB ends a GET_LOCK wait whose connection go-sql-driver closed.
//
// # Advisory locks: the queue, not the lock
//
// pg_advisory_lock and MySQL's GET_LOCK alone belong to a database
// session: behind database/sql's pool, the connection that took one is
// not the one that runs the next statement; a holder cut off from the
// database keeps believing it holds the lock while the server has
// already given it away; they have no TTL, no fence and no owner. Here
// they only order the waiters (see above), on a connection kept for the
// lock's life, and the row keeps every promise. BENCHMARKS.md compares
// both.
//
// # Idempotency records
//
// A record is a row: free (a tombstone keeping an abandoned claim's
// fence), in flight (token, fingerprint, lease) or completed (the result
// and its retention); its attempt column numbers its last claim
// (idem.Claim.Attempt), and the cleanup keeps the row of a claim that
// ended without completing for idem.AttemptMemory. A duplicate's WaitChange
// is woken by NOTIFY on PostgreSQL and polls on MySQL; a duplicate of a
// claim the Store itself holds (a retry that reaches the same process) is
// answered in flight by the Store, with no statement, and woken by the
// claim's finish in the process — the database decides again once the
// claim's lease has run out, and for the duplicate's next Begin; copies
// of a Begin that arrive together share the first one's statement (a
// completed record, too, is read once for the replays that arrive with
// it). Results are limited
// to WithMaxResultBytes (1 MiB by default). A row with an unknown state is
// reported as idem.ErrCorruptRecord, never read as absent. A claim whose
// answer was lost (ctx ended while its statement ran, or the connection
// failed after sending it) is given back in the background — abandoned
// if the record holds the token the Store sent — so that the caller's
// retry does not find the key in flight for nobody until the lease ends;
// a lock's take whose answer was lost is freed the same way.
//
// # Concurrent requests share statements (PostgreSQL)
//
// On a busy service most of the database's work per request is not the
// row but the statement around it: a round trip that wakes a backend, a
// parse-bind-execute, a commit. With pgx, a Store's claims of new keys,
// its reads of held records and its plain completions that arrive while
// four statements of their kind are already in flight queue for the next
// one, which carries them all as one statement over arrays (unnest, at
// most 256 rows and a MiB of arguments: large results go alone): one
// round trip and one commit for many requests. Each
// caller still waits for its own answer and gets exactly what its own
// statement would have given (a duplicate of a key claimed in the same
// statement finds it in flight; a completion whose claim is no longer
// the record's is refused); a claim whose key has a row goes on alone,
// without waiting for a row another transaction is writing. Alone, a call
// goes out at once, as its own single-row statement, so a quiet Store
// adds no latency. A caller whose ctx ends while its call waits is not
// sent; one whose ctx ends while the statement runs is treated as a lost
// answer (see above). On MySQL, and over a driver other than pgx, each
// call goes alone.
//
// # Expiry and cleanup
//
// Expired rows are ignored at once and deleted, once both their expiry and
// their fence are a minute behind the server's clock, by a cleanup loop
// that the Stores on the same tables take turns to run (WithCleanup: one
// of them every minute, in DELETEs of at most 500 rows,
// FOR UPDATE SKIP LOCKED on PostgreSQL), or by Cleanup when you schedule
// it yourself. On PostgreSQL the locks table has no index on its expiry
// and keeps free space in its pages (fillfactor 50): an acquisition or a
// release then rewrites the row in place (a heap-only update) instead of
// adding index entries, which doubles what a hot key takes; the cleanup
// scans that table, which holds only the keys used in the last minute or
// so. The records table, which holds a retention's worth of keys, is
// not indexed on its expiry either (a completion changes it): the
// cleanup finds its rows by a sweep_us column that a claim writes once —
// its lease plus the retention of the Store's last completion, at most a
// day — and sets again for a row it finds there too early (a longer
// retention, a remembered attempt), so a completion writes no index entry (on
// PostgreSQL, a heap-only update). Migrate adds the column and its index
// to tables made before and drops their expiry index; if you apply
// Schema with your own tool, add the column first:
// ALTER TABLE <prefix>records ADD COLUMN sweep_us BIGINT NOT NULL DEFAULT 0.
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
