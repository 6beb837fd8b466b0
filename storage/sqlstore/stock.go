package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/oncekit/oncekit/stock/stockdriver"
)

// stockSweep bounds how many holds that ran out one call ends (the rest
// are ended by the next calls on the item).
const stockSweep = 256

// StockTables returns the names of the tables that keep stock (package
// stock): items (put, free, held, sold) and records (one per key of an
// item).
func (s *Store) StockTables() (items, records string) {
	return s.prefix + "stock_items", s.prefix + "stock_records"
}

// ApplyStock implements stockdriver.Store (package stock), by the
// server's clock. On PostgreSQL a call is one statement, the function
// stock_apply_v1 (made by Migrate) that applies the operations where the
// rows are: the item's row is locked only while it runs, never across a
// round trip. On MySQL it is one transaction: it locks the item's row
// (SELECT … FOR UPDATE), reads the records of the call's keys and of the
// holds that ran out, applies the operations (stockdriver.Apply) and
// writes the item and the changed records back in one statement each. The
// item's row lock orders the calls of every process; the merged calls of
// one process (package stock) make one statement or transaction of many
// takes.
func (s *Store) ApplyStock(ctx context.Context, item string, ops []stockdriver.Op) (stockdriver.Answer, error) {
	if err := s.closedErr("stock", item); err != nil {
		return stockdriver.Answer{}, err
	}
	if s.dialect == Postgres {
		return s.pgApplyStock(ctx, item, ops)
	}
	var a stockdriver.Answer
	err := s.inTx(ctx, "stock", item, func(tx *sql.Tx) error {
		var err error
		a, err = s.applyStock(ctx, tx, item, ops)
		return err
	})
	return a, err
}

func (s *Store) applyStock(ctx context.Context, tx *sql.Tx, item string, ops []stockdriver.Op) (stockdriver.Answer, error) {
	items, _ := s.StockTables()
	it, now, err := s.stockItem(ctx, tx, item)
	if err != nil {
		return stockdriver.Answer{}, err
	}
	created := false
	if !it.Exists && adjusts(ops) {
		// An item's first Put or Add: its row, locked from here on (a
		// concurrent first call waits for this one's commit).
		ins := "INSERT INTO " + items + " (item, put, free, held, sold) VALUES (?, 0, 0, 0, 0)"
		if s.dialect == Postgres {
			ins += " ON CONFLICT (item) DO NOTHING"
		} else {
			ins = strings.Replace(ins, "INSERT", "INSERT IGNORE", 1)
		}
		if _, err := tx.ExecContext(ctx, s.dialect.Rebind(ins), []byte(item)); err != nil {
			return stockdriver.Answer{}, err
		}
		if it, now, err = s.stockItem(ctx, tx, item); err != nil {
			return stockdriver.Answer{}, err
		}
		created = true
	}
	if it.Exists {
		if err := s.stockRecords(ctx, tx, item, now, ops, &it); err != nil {
			return stockdriver.Answer{}, err
		}
	}
	a := stockdriver.Apply(now, &it, ops)
	switch {
	case !it.Exists && created:
		// A first Add that withdrew: the row made for it goes again.
		_, err = tx.ExecContext(ctx, s.dialect.Rebind("DELETE FROM "+items+" WHERE item = ? AND put = 0"), []byte(item))
		return a, err
	case !it.Exists:
		return a, nil
	}
	if _, err := tx.ExecContext(ctx, s.dialect.Rebind("UPDATE "+items+" SET put = ?, free = ?, held = ?, sold = ? WHERE item = ?"),
		it.Put, it.Free, it.Held, it.Sold, []byte(item)); err != nil {
		return a, err
	}
	return a, s.writeStockRecords(ctx, tx, item, &it)
}

func adjusts(ops []stockdriver.Op) bool {
	for _, op := range ops {
		if op.Kind == stockdriver.Add || op.Kind == stockdriver.Set {
			return true
		}
	}
	return false
}

// stockItem reads and locks the item's row, and the server's clock (ms).
func (s *Store) stockItem(ctx context.Context, tx *sql.Tx, item string) (stockdriver.Item, int64, error) {
	items, _ := s.StockTables()
	it := stockdriver.Item{Exists: true}
	var now int64
	err := tx.QueryRowContext(ctx, s.dialect.Rebind("SELECT put, free, held, sold, "+nowUS(s.dialect)+" FROM "+items+" WHERE item = ? FOR UPDATE"),
		[]byte(item)).Scan(&it.Put, &it.Free, &it.Held, &it.Sold, &now)
	if errors.Is(err, sql.ErrNoRows) {
		return stockdriver.Item{}, 0, nil
	}
	return it, now / 1000, err
}

// stockRecords reads into it the records of ops' keys and of the item's
// holds that ran out by now. A record whose memory has passed and that no
// longer holds is left out (it is forgotten; its row is overwritten).
func (s *Store) stockRecords(ctx context.Context, tx *sql.Tx, item string, now int64, ops []stockdriver.Op, it *stockdriver.Item) error {
	_, records := s.StockTables()
	cols := "SELECT take_key, kind, state, units, deadline_ms, until_ms, keep_ms FROM " + records + " WHERE item = ?"
	args := []any{[]byte(item)}
	var keys []string
	seen := make(map[string]bool, len(ops))
	for _, op := range ops {
		if op.Kind != stockdriver.Add && op.Kind != stockdriver.Set && !seen[op.Key] {
			seen[op.Key] = true
			keys = append(keys, "?")
			args = append(args, []byte(op.Key))
		}
	}
	q := cols + " AND state = 2 AND deadline_ms <= ? ORDER BY deadline_ms LIMIT " + fmt.Sprint(stockSweep)
	held := []any{[]byte(item), now}
	if len(keys) > 0 {
		q = cols + " AND take_key IN (" + strings.Join(keys, ", ") + ") UNION ALL (" + q + ")"
		args = append(args, held...)
	} else {
		args = held
	}
	rows, err := tx.QueryContext(ctx, s.dialect.Rebind(q), args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	it.Records = make(map[string]*stockdriver.Record, len(keys))
	for rows.Next() {
		var k []byte
		var kind, st int16
		r := &stockdriver.Record{}
		if err := rows.Scan(&k, &kind, &st, &r.Units, &r.Deadline, &r.Until, &r.Keep); err != nil {
			return err
		}
		r.Key, r.Kind, r.State = string(k), stockdriver.Kind(kind), stockdriver.State(st)
		if !knownStockRecord(r) {
			return fmt.Errorf("stock record %q of item %q: kind %d, state %d: %w", k, item, kind, st, stockdriver.ErrUnknownLayout)
		}
		if r.State != stockdriver.Held && r.Until <= now {
			continue // forgotten
		}
		it.Records[r.Key] = r
	}
	return rows.Err()
}

// knownStockRecord reports whether r is of the layout this version
// writes: a take sold or sold out; a hold held, sold, sold out, released
// or expired.
func knownStockRecord(r *stockdriver.Record) bool {
	switch r.Kind {
	case stockdriver.Take:
		return r.State == stockdriver.Sold || r.State == stockdriver.SoldOut
	case stockdriver.Hold:
		return r.State >= stockdriver.Sold && r.State <= stockdriver.Expired
	}
	return false
}

// writeStockRecords writes it's changed records in one statement.
func (s *Store) writeStockRecords(ctx context.Context, tx *sql.Tx, item string, it *stockdriver.Item) error {
	_, records := s.StockTables()
	var vals []string
	var args []any
	for _, r := range it.Records {
		if !r.Changed {
			continue
		}
		vals = append(vals, "(?, ?, ?, ?, ?, ?, ?, ?)")
		args = append(args, []byte(item), []byte(r.Key), int16(r.Kind), int16(r.State), r.Units, r.Deadline, r.Until, r.Keep)
	}
	if len(vals) == 0 {
		return nil
	}
	q := "INSERT INTO " + records + " (item, take_key, kind, state, units, deadline_ms, until_ms, keep_ms) VALUES " + strings.Join(vals, ", ")
	if s.dialect == Postgres {
		q += " ON CONFLICT (item, take_key) DO UPDATE SET kind = EXCLUDED.kind, state = EXCLUDED.state, units = EXCLUDED.units," +
			" deadline_ms = EXCLUDED.deadline_ms, until_ms = EXCLUDED.until_ms, keep_ms = EXCLUDED.keep_ms"
	} else {
		q += " ON DUPLICATE KEY UPDATE kind = VALUES(kind), state = VALUES(state), units = VALUES(units)," +
			" deadline_ms = VALUES(deadline_ms), until_ms = VALUES(until_ms), keep_ms = VALUES(keep_ms)"
	}
	_, err := tx.ExecContext(ctx, s.dialect.Rebind(q), args...)
	return err
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
	err := s.retry(ctx, func() error {
		rows, err := s.db.QueryContext(ctx, "SELECT idx, st, units, remaining, replayed, found, put, free, held, sold, expired FROM "+
			s.prefix+pgStockFunction+"($1, $2, $3, $4, $5, $6)", []byte(item), kinds, keys, units, ttls, keeps)
		if err != nil {
			return err
		}
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
			case idx <= len(ops):
				a.Results[idx-1] = stockdriver.Result{State: stockdriver.State(st), Units: n, Remaining: time.Duration(rem) * time.Millisecond, Replayed: replayed}
			}
			seen++
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if seen != 1+len(ops) {
			return fmt.Errorf("the stock function answered %d rows for %d operations", seen, len(ops))
		}
		return nil
	})
	if err != nil {
		if strings.Contains(err.Error(), "ONCEKIT_LAYOUT") {
			return stockdriver.Answer{}, fmt.Errorf("sqlstore: stock %q: %w (%v)", item, stockdriver.ErrUnknownLayout, err)
		}
		return stockdriver.Answer{}, s.errWrap("stock", item, err)
	}
	return a, nil
}

// retry runs f again (a few times, after a short random pause) when it
// fails in a way a new attempt may not: a deadlock, a serialization
// failure.
func (s *Store) retry(ctx context.Context, f func() error) error {
	for attempt := 0; ; attempt++ {
		err := f()
		if err == nil || !retryable(err) || attempt >= 4 || ctx.Err() != nil {
			return err
		}
		time.Sleep(time.Duration(rand.Int64N(int64(2*time.Millisecond) << attempt)))
	}
}

var _ stockdriver.Store = (*Store)(nil)
