package sqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/oncekit/oncekit/stock/stockdriver"
)

// StockTables returns the names of the tables that keep stock (package
// stock): items (put, free, held, sold) and records (one per key of an
// item).
func (s *Store) StockTables() (items, records string) {
	return s.prefix + "stock_items", s.prefix + "stock_records"
}

// ApplyStock implements stockdriver.Store (package stock), by the
// server's clock: a call is one statement — the function stock_apply_v1
// on PostgreSQL, the procedure of that name on MySQL (made by Migrate,
// listed by Schema) — that applies the operations where the rows are, the
// rules of stockdriver.Apply in SQL: the item's row is locked only while
// it runs (and, on MySQL, its transaction commits), never across a round
// trip. The row's lock orders the calls of every process; the merged
// calls of one process (package stock) make one statement of many takes.
// A call ends at most 256 holds that ran out (the next calls end the
// rest).
func (s *Store) ApplyStock(ctx context.Context, item string, ops []stockdriver.Op) (stockdriver.Answer, error) {
	if err := s.closedErr("stock", item); err != nil {
		return stockdriver.Answer{}, err
	}
	if s.dialect == Postgres {
		return s.pgApplyStock(ctx, item, ops)
	}
	return s.myApplyStock(ctx, item, ops)
}

// pgApplyStock is ApplyStock on PostgreSQL: one call of the function.
func (s *Store) pgApplyStock(ctx context.Context, item string, ops []stockdriver.Op) (stockdriver.Answer, error) {
	kinds := make([]int16, len(ops))
	keys := make([][]byte, len(ops))
	units := make([]int64, len(ops))
	ttls := make([]int64, len(ops))
	keeps := make([]int64, len(ops))
	for i, op := range ops {
		kinds[i], keys[i], units[i], ttls[i], keeps[i] = int16(op.Kind), []byte(op.Key), op.Units, op.TTL.Milliseconds(), op.Keep.Milliseconds()
	}
	a := stockdriver.Answer{Results: make([]stockdriver.Result, len(ops))}
	q := "SELECT idx, st, units, remaining, replayed, found, put, free, held, sold, expired FROM " + s.prefix + pgStockFunction + "($1, $2, $3, $4, $5, $6)"
	args := []any{[]byte(item), kinds, keys, units, ttls, keeps}
	readCommitted := false
	err := s.retry(ctx, func() error {
		if !readCommitted {
			rows, err := s.db.QueryContext(ctx, q, args...)
			if err != nil {
				readCommitted = retryable(err)
				return err
			}
			return scanStock(rows, &a)
		}
		// Sessions whose default isolation is REPEATABLE READ or
		// SERIALIZABLE fail a statement that updates the hot row after
		// another did: the call runs at READ COMMITTED, whose update waits
		// for the row and takes its latest version.
		tx, err := s.db.BeginTx(ctx, s.ownTx())
		if err != nil {
			return err
		}
		rows, err := tx.QueryContext(ctx, q, args...)
		if err == nil {
			err = scanStock(rows, &a)
		}
		if err != nil {
			_ = tx.Rollback()
			return err
		}
		return tx.Commit()
	})
	if err != nil {
		if strings.Contains(err.Error(), "ONCEKIT_LAYOUT") {
			return stockdriver.Answer{}, fmt.Errorf("sqlstore: stock %q: %w (%v)", item, stockdriver.ErrUnknownLayout, err)
		}
		return stockdriver.Answer{}, s.errWrap("stock", item, err)
	}
	return a, nil
}

// scanStock reads the stock function's rows into a and closes them.
func scanStock(rows *sql.Rows, a *stockdriver.Answer) error {
	defer rows.Close()
	seen := 0
	for rows.Next() {
		var idx, expired int
		var st int16
		var n, rem int64
		var replayed, found bool
		var l stockdriver.Level
		if err := rows.Scan(&idx, &st, &n, &rem, &replayed, &found, &l.Put, &l.Free, &l.Held, &l.Sold, &expired); err != nil {
			return err
		}
		switch {
		case idx == 0:
			a.Exists, a.Level, a.Expired = found, l, expired
		case idx <= len(a.Results):
			a.Results[idx-1] = stockdriver.Result{State: stockdriver.State(st), Units: n, Remaining: time.Duration(rem) * time.Millisecond, Replayed: replayed}
		}
		seen++
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if seen != 1+len(a.Results) {
		return fmt.Errorf("the stock function answered %d rows for %d operations", seen, len(a.Results))
	}
	return nil
}

// myApplyStock is ApplyStock on MySQL: one call of the procedure.
func (s *Store) myApplyStock(ctx context.Context, item string, ops []stockdriver.Op) (stockdriver.Answer, error) {
	var b strings.Builder
	for i, op := range ops {
		if i > 0 {
			b.WriteByte(';')
		}
		fmt.Fprintf(&b, "%d,%x,%d,%d,%d", op.Kind, op.Key, op.Units, op.TTL.Milliseconds(), op.Keep.Milliseconds())
	}
	var answer string
	err := s.retry(ctx, func() error {
		return s.db.QueryRowContext(ctx, "CALL "+s.prefix+pgStockFunction+"(?, ?)", []byte(item), b.String()).Scan(&answer)
	})
	if err != nil {
		if strings.Contains(err.Error(), "ONCEKIT_LAYOUT") {
			return stockdriver.Answer{}, fmt.Errorf("sqlstore: stock %q: %w (%v)", item, stockdriver.ErrUnknownLayout, err)
		}
		return stockdriver.Answer{}, s.errWrap("stock", item, err)
	}
	a, err := parseStockAnswer(answer, len(ops))
	if err != nil {
		return a, fmt.Errorf("sqlstore: stock %q: %w", item, err)
	}
	return a, nil
}

// parseStockAnswer reads the procedure's answer:
// "exists,put,free,held,sold,expired" and ";state,units,remaining,replayed"
// per operation.
func parseStockAnswer(answer string, n int) (stockdriver.Answer, error) {
	parts := strings.Split(answer, ";")
	if len(parts) != 1+n {
		return stockdriver.Answer{}, fmt.Errorf("the stock procedure answered %d parts for %d operations", len(parts)-1, n)
	}
	var exists, expired int
	var a stockdriver.Answer
	if _, err := fmt.Sscanf(parts[0], "%d,%d,%d,%d,%d,%d", &exists, &a.Level.Put, &a.Level.Free, &a.Level.Held, &a.Level.Sold, &expired); err != nil {
		return a, fmt.Errorf("the stock procedure's answer %q: %w", parts[0], err)
	}
	a.Exists, a.Expired = exists == 1, expired
	a.Results = make([]stockdriver.Result, n)
	for i, p := range parts[1:] {
		var st, rep int
		var units, rem int64
		if _, err := fmt.Sscanf(p, "%d,%d,%d,%d", &st, &units, &rem, &rep); err != nil {
			return a, fmt.Errorf("the stock procedure's answer %q: %w", p, err)
		}
		a.Results[i] = stockdriver.Result{State: stockdriver.State(st), Units: units, Remaining: time.Duration(rem) * time.Millisecond, Replayed: rep == 1}
	}
	return a, nil
}

var _ stockdriver.Store = (*Store)(nil)
