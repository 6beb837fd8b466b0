package inventory

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/oncekit/oncekit/storage/sqlstore"
)

// SQL is the inventory in PostgreSQL or MySQL, in the database of
// sqlstore's records: a sale's writes — the stock, the order, the outbox
// row — commit with its record, in the statement that completes it
// (sqlstore.Writes), together or not at all. Tables
// inventory_items, inventory_orders, inventory_outbox and
// inventory_shipments hold every namespace (the prefix) side by side.
type SQL struct {
	db      *sql.DB
	dialect sqlstore.Dialect
	ns      string
	stock   sharedReads[stockRow] // concurrent reads of a SKU's row share a query (Item, Sell)
}

// stockRow is a SKU's stock, its sold count and the fence of its last
// write.
type stockRow struct{ stock, sold, fence int64 }

// NewSQL returns the inventory in db under namespace ns. Call Migrate once
// to create its tables.
func NewSQL(db *sql.DB, dialect sqlstore.Dialect, ns string) *SQL {
	return &SQL{db: db, dialect: dialect, ns: ns}
}

// Migrate creates the inventory's tables where they do not exist.
func (s *SQL) Migrate(ctx context.Context) error {
	name := "text" // PostgreSQL compares text byte for byte (C collation of the key columns)
	if s.dialect == sqlstore.MySQL {
		name = "VARBINARY(128)" // never a case-insensitive collation: "A" and "a" are two SKUs
	}
	for _, stmt := range []string{
		"CREATE TABLE IF NOT EXISTS inventory_items (ns " + name + " NOT NULL, sku " + name + " NOT NULL," +
			" stock BIGINT NOT NULL, sold BIGINT NOT NULL, fence BIGINT NOT NULL, PRIMARY KEY (ns, sku))",
		"CREATE TABLE IF NOT EXISTS inventory_orders (ns " + name + " NOT NULL, id " + name + " NOT NULL, body TEXT NOT NULL, PRIMARY KEY (ns, id))",
		"CREATE TABLE IF NOT EXISTS inventory_outbox (ns " + name + " NOT NULL, id " + name + " NOT NULL, body TEXT NOT NULL, PRIMARY KEY (ns, id))",
		"CREATE TABLE IF NOT EXISTS inventory_shipments (ns " + name + " NOT NULL, id " + name + " NOT NULL, PRIMARY KEY (ns, id))",
	} {
		if _, err := s.db.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("inventory: create tables: %w", err)
		}
	}
	return nil
}

// q numbers the ? placeholders of query for PostgreSQL.
func (s *SQL) q(query string) string { return s.dialect.Rebind(query) }

func (s *SQL) PutItem(ctx context.Context, sku string, stock int64, fence uint64) (Item, error) {
	// Written only over an older fence's write: a paused former holder of
	// the SKU lock cannot put back the stock it read.
	query := "INSERT INTO inventory_items AS i (ns, sku, stock, sold, fence) VALUES (?, ?, ?, 0, ?)" +
		" ON CONFLICT (ns, sku) DO UPDATE SET stock = EXCLUDED.stock, sold = 0, fence = EXCLUDED.fence WHERE i.fence < EXCLUDED.fence"
	if s.dialect == sqlstore.MySQL { // assignments run left to right: fence last
		query = "INSERT INTO inventory_items (ns, sku, stock, sold, fence) VALUES (?, ?, ?, 0, ?) ON DUPLICATE KEY UPDATE" +
			" stock = IF(fence < VALUES(fence), VALUES(stock), stock), sold = IF(fence < VALUES(fence), 0, sold)," +
			" fence = IF(fence < VALUES(fence), VALUES(fence), fence)"
	}
	res, err := s.db.ExecContext(ctx, s.q(query), s.ns, sku, stock, int64(fence))
	if err != nil {
		return Item{}, err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return Item{}, ErrStaleFence
	}
	return Item{SKU: sku, Stock: stock}, nil
}

func (s *SQL) Item(ctx context.Context, sku string) (Item, error) {
	r, err := s.stock.read(ctx, sku, s.readStock(sku))
	if errors.Is(err, sql.ErrNoRows) {
		return Item{}, ErrUnknownSKU
	}
	return Item{SKU: sku, Stock: r.stock, Sold: r.sold}, err
}

// readStock is the query of sku's row.
func (s *SQL) readStock(sku string) func(context.Context) (stockRow, error) {
	return func(ctx context.Context) (stockRow, error) {
		var r stockRow
		err := s.db.QueryRowContext(ctx, s.q("SELECT stock, sold, fence FROM inventory_items WHERE ns = ? AND sku = ?"), s.ns, sku).
			Scan(&r.stock, &r.sold, &r.fence)
		return r, err
	}
}

func (s *SQL) Order(ctx context.Context, id string) (Order, error) {
	var body string
	err := s.db.QueryRowContext(ctx, s.q("SELECT body FROM inventory_orders WHERE ns = ? AND id = ?"), s.ns, id).Scan(&body)
	if errors.Is(err, sql.ErrNoRows) {
		return Order{}, ErrUnknownOrder
	}
	if err != nil {
		return Order{}, err
	}
	var o Order
	if err := json.Unmarshal([]byte(body), &o); err != nil {
		return Order{}, fmt.Errorf("inventory: corrupt order %q: %w", id, err)
	}
	return o, nil
}

// LockFree is true: the sale's UPDATE checks and takes the stock in one
// statement, under the row's lock.
func (s *SQL) LockFree() bool { return true }

// check reads why a sale cannot go ahead, or nil: under the SKU lock
// (lockFence not 0) in a read of its own, else in a read shared with the
// concurrent buyers of the SKU.
func (s *SQL) check(ctx context.Context, o Order, lockFence uint64) error {
	var r stockRow
	var err error
	if lockFence != 0 {
		// (Under the SKU's lock a read of its own: one shared with the
		// buyers outside may start only after the one in flight ends,
		// and the lock waits for it.)
		r, err = s.readStock(o.SKU)(ctx)
	} else {
		r, err = s.stock.read(ctx, o.SKU, s.readStock(o.SKU))
	}
	stock, fence := r.stock, r.fence
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return ErrUnknownSKU
	case err != nil:
		return err
	case lockFence != 0 && uint64(fence) >= lockFence:
		return ErrStaleFence
	case stock < o.Qty:
		return ErrSoldOut
	}
	return nil
}

func (s *SQL) Sell(ctx context.Context, o Order, lockFence uint64) (any, error) {
	if err := s.check(ctx, o, lockFence); err != nil {
		return nil, err
	}
	body, _ := json.Marshal(o)
	// The stock is checked and taken in one statement; the fence
	// condition refuses a holder whose lock a later one wrote under.
	take := "UPDATE inventory_items SET stock = stock - ?, sold = sold + ?, fence = GREATEST(fence, ?) WHERE ns = ? AND sku = ? AND stock >= ?"
	takeArgs := []any{o.Qty, o.Qty, int64(lockFence), s.ns, o.SKU, o.Qty}
	if lockFence != 0 {
		take += " AND fence < ?"
		takeArgs = append(takeArgs, int64(lockFence))
	}
	// One statement with the record's completion (on MySQL 8, which runs
	// it as a transaction of statements, one round trip each): the SKU's
	// row is locked while it runs, never across a round trip to this
	// process, where every sale of the SKU waits for it. A take that
	// changes no row refuses the sale: without the lock, the units went
	// since the check; under it (checked there), a later holder's write.
	why := ErrSoldOut
	if lockFence != 0 {
		why = ErrStaleFence
	}
	return sqlstore.Writes{
		{Query: "INSERT INTO inventory_orders (ns, id, body) VALUES (?, ?, ?)", Args: []any{s.ns, o.OrderID, string(body)}},
		{Query: "INSERT INTO inventory_outbox (ns, id, body) VALUES (?, ?, ?)", Args: []any{s.ns, o.OrderID, string(body)}},
		{Query: take, Args: takeArgs, Refuse: why.Error()},
	}, nil
}

func (s *SQL) Outbox(ctx context.Context, n int) ([]Order, error) {
	rows, err := s.db.QueryContext(ctx, s.q("SELECT id, body FROM inventory_outbox WHERE ns = ? ORDER BY id LIMIT ?"), s.ns, n)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Order
	for rows.Next() {
		var id, body string
		if err := rows.Scan(&id, &body); err != nil {
			return nil, err
		}
		var o Order
		if err := json.Unmarshal([]byte(body), &o); err != nil {
			return nil, fmt.Errorf("inventory: corrupt outbox entry %q: %w", id, err)
		}
		out = append(out, o)
	}
	return out, rows.Err()
}

func (s *SQL) Published(ctx context.Context, orders []Order) error {
	ids := orderIDs(orders)
	if len(ids) == 0 {
		return nil
	}
	args := []any{s.ns}
	for _, id := range ids {
		args = append(args, id)
	}
	_, err := s.db.ExecContext(ctx, s.q("DELETE FROM inventory_outbox WHERE ns = ? AND id IN (?"+strings.Repeat(", ?", len(ids)-1)+")"), args...)
	return err
}

func (s *SQL) Ship(_ context.Context, o Order) (any, error) {
	id := o.OrderID
	query := "INSERT INTO inventory_shipments (ns, id) VALUES (?, ?) ON CONFLICT DO NOTHING"
	if s.dialect == sqlstore.MySQL {
		query = "INSERT IGNORE INTO inventory_shipments (ns, id) VALUES (?, ?)"
	}
	return sqlstore.Effect(func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, s.q(query), s.ns, id)
		return err
	}), nil
}

func (s *SQL) Counts(ctx context.Context) (orders, shipments int64, err error) {
	err = s.db.QueryRowContext(ctx, s.q("SELECT (SELECT COUNT(*) FROM inventory_orders WHERE ns = ?), (SELECT COUNT(*) FROM inventory_shipments WHERE ns = ?)"),
		s.ns, s.ns).Scan(&orders, &shipments)
	return orders, shipments, err
}
