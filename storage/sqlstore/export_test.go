package sqlstore

import (
	"context"
	"database/sql"
)

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

// HoldBatches makes the Store's claims, reads and completions queue, as
// while the maximum of their statements is in flight, until release is
// called: then the queued calls go out together. queued counts them.
func (s *Store) HoldBatches() (queued func() int, release func()) {
	if s.begins == nil {
		return func() int { return 0 }, func() {}
	}
	s.begins.hold()
	s.reads.hold()
	s.completes.hold()
	queued = func() int { return s.begins.queued() + s.reads.queued() + s.completes.queued() }
	return queued, func() {
		s.begins.unhold()
		s.reads.unhold()
		s.completes.unhold()
	}
}

// Batched is how many statements the Store sent for more than one call.
func (s *Store) Batched() int64 {
	if s.begins == nil {
		return 0
	}
	return s.begins.batches.Load() + s.reads.batches.Load() + s.completes.batches.Load()
}

func (b *batcher[A, R]) hold() {
	b.mu.Lock()
	b.flushers += maxFlushers
	b.mu.Unlock()
}

func (b *batcher[A, R]) unhold() {
	b.mu.Lock()
	b.flushers -= maxFlushers
	for len(b.queue) > 0 && b.flushers < maxFlushers {
		b.startLocked()
	}
	b.mu.Unlock()
}

func (b *batcher[A, R]) queued() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.queue)
}

// WarmStatements are the statements Warm prepares.
func (s *Store) WarmStatements() []string {
	return s.warmStatements(s.dialect == MySQL && s.returning(context.Background()))
}

// MyPrepared counts the statements c's connection keeps prepared of
// stmts (a MySQL connection of Open's pool; 0 on any other).
func MyPrepared(c *sql.Conn, stmts []string) (int, error) {
	n := 0
	err := c.Raw(func(dc any) error {
		if mc, ok := dc.(*myConn); ok {
			for _, st := range stmts {
				if mc.stmts[st] != nil {
					n++
				}
			}
		}
		return nil
	})
	return n, err
}
