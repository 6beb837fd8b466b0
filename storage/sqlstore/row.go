package sqlstore

import (
	"context"
	"database/sql"
	"errors"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
)

// row is a one-row statement, run when it is scanned (Store.queryRow).
type row struct {
	s     *Store
	ctx   context.Context
	query string
	args  []any
}

// queryRow is db.QueryRowContext, except on pgx: there the statement goes
// through the pool's pgx connection itself (database/sql's Conn.Raw).
// database/sql starts a goroutine for every row set read under a context
// that can end (to close it when the context does), which is every
// request's context and every Release's bounded one: on a two-core
// machine that goroutine cost a new-key lock cycle ~40 µs of its ~220.
// pgx watches the context without one.
func (s *Store) queryRow(ctx context.Context, query string, args ...any) row {
	return row{s: s, ctx: ctx, query: query, args: args}
}

// maxStaleConns is how many pooled connections found dead (the server
// restarted) a statement skips before it gives up, as database/sql does.
const maxStaleConns = 2

// Scan runs the statement and scans its one row into dest, reporting
// sql.ErrNoRows (as errors.Is sees it) when there is none.
func (r row) Scan(dest ...any) error {
	if !r.s.pgx {
		return r.s.db.QueryRowContext(r.ctx, r.query, r.args...).Scan(dest...)
	}
	for attempt := 0; ; attempt++ {
		c, err := r.s.db.Conn(r.ctx)
		if err != nil {
			return err
		}
		native := true
		err = c.Raw(func(dc any) error {
			pc, ok := dc.(*stdlib.Conn)
			if !ok {
				native = false
				return nil
			}
			return pc.Conn().QueryRow(r.ctx, r.query, r.args...).Scan(dest...)
		})
		// (A pgx connection a fault closed is dropped by the pool when it
		// is next taken: stdlib's ResetSession reports it bad.)
		_ = c.Close()
		if !native {
			return r.s.db.QueryRowContext(r.ctx, r.query, r.args...).Scan(dest...)
		}
		// A pooled connection that was dead before the statement was
		// sent (nothing reached the server): another one, as database/sql
		// would have taken.
		if err != nil && attempt < maxStaleConns && pgconn.SafeToRetry(err) && r.ctx.Err() == nil && !errors.Is(err, sql.ErrNoRows) {
			continue
		}
		return err
	}
}
