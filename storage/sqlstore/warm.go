package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/oncekit/oncekit/core/lock"
)

// Warm opens n connections of the Store's pool ahead of traffic and
// prepares the Store's common statements on them, so that the first burst
// of requests after a quiet start — a flash sale's first second, a replica
// that just joined — does not pay on its critical path for what a new
// connection costs once: the server's session start (a process on
// PostgreSQL) and each statement's preparation. A service calls it once,
// after Migrate and before it reports ready (storage.Warmer); the
// connections then stay in the pool as its other idle ones do.
//
// n is never more than the pool's SetMaxOpenConns less the connections in
// use (the Store keeps one for its LISTEN session), and n ≤ 0 warms that
// many (15 of Open's 16), or DefaultMaxConns on a pool without a maximum;
// a connection the pool does not hand out within a second, because others
// took it meanwhile, ends the warming there (one the server does not open
// within a second is an error). A pool made elsewhere (New) keeps only
// SetMaxIdleConns connections when they are handed back (database/sql's
// default is 2): set it to at least n. database/sql closes a connection
// left idle longer than SetConnMaxIdleTime (5 minutes on Open's pool): a
// service that expects a burst long after it started calls Warm again
// shortly before.
//
// Statements are prepared on PostgreSQL through pgx with its default
// query mode (behind pgbouncer in transaction pooling mode, with
// default_query_exec_mode=exec, connections are opened and nothing is
// prepared) and on MySQL on the connections of Open's pool. Warm returns
// the first error it met; the connections warmed before it stay warm.
func (s *Store) Warm(ctx context.Context, n int) error {
	if s.closed() {
		return fmt.Errorf("sqlstore: warm: %w", lock.ErrClosed)
	}
	st := s.db.Stats()
	if free := st.MaxOpenConnections - st.InUse; st.MaxOpenConnections > 0 && (n <= 0 || n > free) {
		n = free
	} else if n <= 0 {
		n = DefaultMaxConns
	}
	// The connections are all held until each is warm: handed back one by
	// one, the pool would give the next caller the same one again.
	conns := make([]*sql.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	var (
		mu    sync.Mutex
		first error
		wg    sync.WaitGroup
	)
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if first == nil {
			first = err
		}
	}
	for range n {
		waits := s.db.Stats().WaitCount
		wctx, cancel := context.WithTimeout(ctx, warmWait)
		c, err := s.db.Conn(wctx)
		cancel()
		if err != nil {
			// The pool is busy (Warm waited for a connection others hold:
			// warm enough), or the server did not answer in time (an
			// error, as any other).
			busy := errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil && s.db.Stats().WaitCount > waits
			if !busy {
				fail(err)
			}
			break
		}
		conns = append(conns, c)
		wg.Go(func() {
			if err := s.warmConn(ctx, c); err != nil {
				fail(err)
			}
		})
	}
	wg.Wait()
	if first != nil {
		return fmt.Errorf("sqlstore: warm: %w", first)
	}
	return nil
}

// warmWait is how long Warm waits for the pool to give it one more
// connection.
const warmWait = time.Second

// warmStatements are the statements Warm prepares: those of a lock's take
// and release and of a claim's begin and completion, the common path of
// every request, and on PostgreSQL their forms for many calls, which a
// burst uses (batch.go); returning adds MariaDB's (see Begin).
func (s *Store) warmStatements(returning bool) []string {
	q := &s.q
	var list []string
	if s.dialect == Postgres {
		list = []string{q.leanBegin, q.fastComplete, q.fastBegin, q.recSelect,
			q.leanBeginMany, q.fastCompleteMany, q.recSelectMany,
			q.fastAcquire, q.fastRelease, q.releaseNotify, q.notifyHead, q.renewHold}
		if s.sessionQueue {
			list = append(list, q.sqTry, q.sqWait, q.sqRelease, q.sqLeft, q.sqUnlock)
		}
	} else {
		list = []string{q.myBegin, q.myComplete, q.myAcquire, q.myRelease, q.renewHold}
		if returning {
			list = append(list, q.myBeginInsert, q.myBeginReturning)
		}
		if s.sessionQueue {
			list = append(list, q.sqTry, q.sqWait, q.sqRelease)
		}
	}
	out := list[:0]
	for _, st := range list {
		if st != "" {
			out = append(out, st) // (numbered for PostgreSQL already)
		}
	}
	return out
}

// warmConn makes sure c's session is open and prepares the Store's
// statements on it where the connection keeps prepared statements.
func (s *Store) warmConn(ctx context.Context, c *sql.Conn) error {
	if err := c.PingContext(ctx); err != nil {
		return err
	}
	returning := false
	if s.dialect == MySQL && !s.noReturning {
		// Asked on c, not through the pool, whose other connections Warm
		// may hold.
		var v string
		if err := c.QueryRowContext(ctx, "SELECT VERSION()").Scan(&v); err != nil {
			return err
		}
		returning = returningVersion(v)
	}
	stmts := s.warmStatements(returning)
	return c.Raw(func(dc any) error {
		switch dc := dc.(type) {
		case *stdlib.Conn:
			pc := dc.Conn()
			if pc.Config().DefaultQueryExecMode != pgx.QueryExecModeCacheStatement {
				return nil // (unnamed statements: nothing to keep)
			}
			for _, st := range stmts {
				// Named by its text: pgx runs a query whose text names a
				// prepared statement through it.
				if _, err := pc.Prepare(ctx, st, st); err != nil {
					return err
				}
			}
		case *myConn:
			for _, st := range stmts {
				if _, err := dc.prepare(ctx, st); err != nil {
					return err
				}
			}
		}
		return nil
	})
}
