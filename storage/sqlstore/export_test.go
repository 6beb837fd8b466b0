package sqlstore

import "context"

// NowUS is the statements' reading of the server's clock, for tests.
var NowUS = nowUS

// WithoutReturning makes a MySQL Store claim records as it does on MySQL 8
// (a read, then an upsert), on MariaDB too.
func WithoutReturning() Option { return func(s *Store) { s.noReturning = true } }

// SessionID is the number of key's session lock (pg_advisory_lock's).
func (s *Store) SessionID(key string) int64 { return s.sessionID(key) }

// QueueWaiter gives waiter a place in key's waiters-table queue, as an
// acquisition that found no connection to wait on keeps one.
func (s *Store) QueueWaiter(ctx context.Context, key, waiter string) error {
	return s.queueAlone(ctx, key, waiter)
}

// CleanupRuns is how many times the Store's cleanup loop has cleaned.
func (s *Store) CleanupRuns() int64 { return s.cleanups.Load() }
