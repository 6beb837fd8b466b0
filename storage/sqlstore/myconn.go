package sqlstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
)

// MySQL's statements, prepared on the server once per connection. The
// Store's statements are long (the server's clock is a long expression,
// the takes are ON DUPLICATE KEY UPDATE chains) and sent as text they
// are parsed again on every run: on a new key, about a fifth of what
// MariaDB spends on a lock cycle (measured side by side, BENCHMARKS.md). go-sql-driver/mysql prepares a statement per call
// unless it is kept, and database/sql keeps prepared statements only for
// a *sql.DB or a transaction, not for the *sql.Conn that holds a lock's
// session lock. So the connections of a *sql.DB that OpenDB makes (Open
// too) keep the statements they prepared, in a map that lives and dies
// with the connection (myConn). A *sql.DB made elsewhere (New) sends
// text, as before.

// myDriverConn is what database/sql and the Store use of a
// go-sql-driver/mysql connection.
type myDriverConn interface {
	driver.Conn
	driver.ConnBeginTx
	driver.ConnPrepareContext
	driver.ExecerContext
	driver.QueryerContext
	driver.Pinger
	driver.SessionResetter
	driver.Validator
	driver.NamedValueChecker
}

// myConnector makes the connections of a MySQL *sql.DB myConns.
type myConnector struct{ driver.Connector }

func (c myConnector) Connect(ctx context.Context) (driver.Conn, error) {
	dc, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	if mc, ok := dc.(myDriverConn); ok {
		return &myConn{myDriverConn: mc}, nil
	}
	return dc, nil // (a driver that changed: statements go as text)
}

// myConn is a MySQL connection that keeps the statements the Store
// prepared on it. database/sql hands a connection to one goroutine at a
// time, so its fields need no lock.
type myConn struct {
	myDriverConn
	id    connID                 // CONNECTION_ID() and its server, once asked (0: not yet)
	stmts map[string]driver.Stmt // by text; nil: sent as text (not preparable)
}

// myStmtLimit bounds the statements one connection keeps: the Store's
// own are about a dozen per table prefix.
const myStmtLimit = 64

// exec runs query with args, prepared on the connection the first time.
func (c *myConn) exec(ctx context.Context, query string, args []any) (driver.Result, error) {
	nv := make([]driver.NamedValue, len(args))
	for i, a := range args {
		nv[i] = driver.NamedValue{Ordinal: i + 1, Value: a}
		if err := c.CheckNamedValue(&nv[i]); err != nil {
			return nil, err
		}
	}
	st, err := c.prepare(ctx, query)
	if err != nil {
		return nil, err
	}
	if st == nil {
		return c.ExecContext(ctx, query, nv)
	}
	return st.(driver.StmtExecContext).ExecContext(ctx, nv)
}

// prepare prepares query on the connection unless it did already, and
// returns its statement: nil when it goes as text (past the connection's
// limit of statements, or refused by the server).
func (c *myConn) prepare(ctx context.Context, query string) (driver.Stmt, error) {
	if st, known := c.stmts[query]; known || len(c.stmts) >= myStmtLimit {
		return st, nil
	}
	var st driver.Stmt
	p, err := c.PrepareContext(ctx, query)
	switch {
	case err == nil:
		st = p
	case !serverAnswer(err):
		return nil, err
	}
	// (A statement the server will not prepare — one refused in the
	// binary protocol, or past max_prepared_stmt_count — goes as text
	// from now on.)
	if c.stmts == nil {
		c.stmts = make(map[string]driver.Stmt)
	}
	c.stmts[query] = st
	return st, nil
}

// connExec is c.ExecContext, through a statement c's connection keeps
// prepared when it is a myConn.
func connExec(ctx context.Context, c *sql.Conn, query string, args ...any) (sql.Result, error) {
	res, kept, err := keptExec(ctx, c, query, args)
	if !kept && err == nil {
		return c.ExecContext(ctx, query, args...)
	}
	return res, err
}

// keptExec runs query on c through the statement its connection keeps
// prepared, and reports whether the connection is a myConn (when it is
// not, nothing ran).
func keptExec(ctx context.Context, c *sql.Conn, query string, args []any) (res sql.Result, kept bool, err error) {
	err = c.Raw(func(dc any) error {
		mc, ok := dc.(*myConn)
		if !ok {
			return nil
		}
		kept = true
		// (On driver.ErrBadConn, Raw closes the connection, as
		// ExecContext would.)
		r, err := mc.exec(ctx, query, args)
		res = r
		return err
	})
	return res, kept, err
}

// exec is s.db.ExecContext, through a kept prepared statement on MySQL
// connections that OpenDB made.
func (s *Store) exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if s.dialect != MySQL || s.myText.Load() {
		return s.db.ExecContext(ctx, query, args...)
	}
	c, err := s.db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	res, kept, err := keptExec(ctx, c, query, args)
	if !kept && err == nil {
		s.myText.Store(true) // (not a *sql.DB of OpenDB's)
		return c.ExecContext(ctx, query, args...)
	}
	return res, err
}
