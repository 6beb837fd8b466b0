package sqlstore

import (
	"time"

	"github.com/oncekit/oncekit/core/observe"
)

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
