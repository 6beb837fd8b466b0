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
// (WithTablePrefix, default "oncekit_").
//
// # Effects in the caller's transaction
//
// A Guard run attaches a sqlstore.Effect, func(ctx, *sql.Tx) error, with
// idem.Commit: the Store locks the record's row, checks that the claim is
// still the run's, runs the effect and completes the record in that one
// transaction. A process killed anywhere in it leaves nothing committed,
// and the retry runs again; a claim lost meanwhile rolls everything back
// (idem.ErrLockLost). When the application's framework owns the
// transaction, idem.Commit(ctx, sqlstore.InTx(tx)) completes the record in
// it instead — the caller commits after Guard.Do returns — and
// Store.CompleteInTx does the same for code that calls Begin itself. Not
// under httpmw, grpcmw or kafkamw, which answer when Guard.Do returns,
// before that commit: there Commit refuses InTx (idem.ErrCallerCommits),
// and sqlstore.Effect is the way. A caller's transaction must run at READ
// COMMITTED: at REPEATABLE READ or SERIALIZABLE it cannot complete a
// claim the watchdog extended after its snapshot (CompleteInTx says so).
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
// free with nobody queued (also Acquire's first look), a first waiter
// taking the free key, releasing the last hold (on PostgreSQL with the
// notification of the first waiter; a second statement notifies it when a
// waiter queued while the release waited for the row), claiming a free
// record and completing it (on MySQL 8 a claim reads first: two), and
// answering a duplicate or a replay (a read without locks). On pgx these
// statements go through the pool's pgx connection itself rather than
// database/sql's rows, which would start a goroutine per query under a
// context that can end. Everything else
// (re-entry, a held key, a refresh, an effect) is a transaction that locks
// the row first.
//
// Waiters queue in <prefix>lock_waiters, and a free key goes to the
// longest-queued live waiter, so processes that release and take a key
// back in a loop cannot starve one that waits. A release wakes that first
// waiter only: on PostgreSQL through pgx by NOTIFY (sent in the release's
// transaction, delivered at its commit, received on one LISTEN connection
// per Store), in the same process at once. MySQL has no notification:
// waiters look at the key without locks (MVCC reads) — the first every
// WithPollInterval/10 (5 ms by default), the next few a little less often,
// the rest every WithPollInterval (50 ms) — and take the row lock only
// when the key is free and theirs. Expect a hand-off in ~5 ms on MySQL and
// each waiting process to make 20–200 small reads a second. Every waiter
// renews its place once a second; a waiter that died holds its place (and
// a free key it is first in line for) for at most three seconds. A waiter
// keeps its place while the database does not answer (a crash, a restart,
// a cut connection) for up to those three seconds, asking again every
// 20–250 ms: after a short outage it takes the key in its turn instead of
// failing and leaving its place to block its own retry. The first waiter
// sleeps until the holder's expiry at most, re-read at every look: a
// holder that extended its lease and then died frees the key on time.
//
// # Why not advisory locks
//
// pg_advisory_lock and MySQL's GET_LOCK belong to a database session: the
// lock lives exactly as long as one connection. Behind database/sql's
// pool, the connection that took it is not the one that runs the next
// statement, a pool may close an idle connection (releasing the lock
// silently) and a holder cut off from the database keeps believing it
// holds the lock while the server has already given it away; they have no
// TTL, no fence and no owner. A transaction-scoped pg_advisory_xact_lock
// is safe — it lives exactly as long as one transaction — and this driver
// is one way to hold a lock longer than a transaction with the same
// safety. BENCHMARKS.md compares both.
//
// # Idempotency records
//
// A record is a row: free (a tombstone keeping an abandoned claim's
// fence), in flight (token, fingerprint, lease) or completed (the result
// and its retention). A duplicate's WaitChange
// is woken by NOTIFY on PostgreSQL and polls on MySQL. Results are limited
// to WithMaxResultBytes (1 MiB by default). A row with an unknown state is
// reported as idem.ErrCorruptRecord, never read as absent.
//
// # Expiry and cleanup
//
// Expired rows are ignored at once and deleted, once both their expiry and
// their fence are a minute behind the server's clock, by a cleanup loop in
// every Store (WithCleanup: every minute, in DELETEs of at most 500 rows,
// FOR UPDATE SKIP LOCKED on PostgreSQL), or by Cleanup when you schedule
// it yourself.
//
// # Connections
//
// On MySQL, use the DSN that Open builds (or set the same yourself):
// interpolateParams=true, one round trip per statement instead of three
// for a server-side prepared statement, and time_zone='+00:00', so that
// the server's clock reads the same in every session. The Store uses the
// server's default isolation level: every decision rests on rows it has
// locked, which every level reads as committed.
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
// notify=false (WithoutNotify) makes waiters poll as on MySQL: the first
// waiter every WithPollInterval/10 (5 ms), so a hand-off takes a few
// milliseconds instead of a notification's fraction of one.
// default_query_exec_mode=exec is pgx's: unnamed statements, one round
// trip each. Without notify=false, LISTEN runs on whichever server
// connection the pooler lends for that one statement, and the
// notifications go astray: waiters then wait up to a second per look
// (the conformance suites time out). Session pooling (pool_mode =
// session) needs neither setting.
package sqlstore
