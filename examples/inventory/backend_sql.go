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
// sqlstore's records: an order's writes — the order and its outbox row —
// commit with its record, in the statement that completes it
// (sqlstore.Writes), together or not at all. Tables inventory_orders,
// inventory_outbox and inventory_shipments hold every namespace (the
// prefix) side by side.
type SQL struct {
	Stocked
	db      *sql.DB
	dialect sqlstore.Dialect
	ns      string
}

// NewSQL returns the inventory in db under namespace ns, its stock in st.
// Call Migrate once to create its tables.
func NewSQL(st Stocked, db *sql.DB, dialect sqlstore.Dialect, ns string) *SQL {
	return &SQL{Stocked: st, db: db, dialect: dialect, ns: ns}
}

// Migrate creates the inventory's tables where they do not exist.
func (s *SQL) Migrate(ctx context.Context) error {
	name := "text" // PostgreSQL compares text byte for byte (C collation of the key columns)
	if s.dialect == sqlstore.MySQL {
		name = "VARBINARY(128)" // never a case-insensitive collation: "A" and "a" are two SKUs
	}
	for _, stmt := range []string{
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

func (s *SQL) Record(_ context.Context, o Order) (any, error) {
	body, _ := json.Marshal(o)
	return sqlstore.Writes{
		{Query: "INSERT INTO inventory_orders (ns, id, body) VALUES (?, ?, ?)", Args: []any{s.ns, o.OrderID, string(body)}},
		{Query: "INSERT INTO inventory_outbox (ns, id, body) VALUES (?, ?, ?)", Args: []any{s.ns, o.OrderID, string(body)}},
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
