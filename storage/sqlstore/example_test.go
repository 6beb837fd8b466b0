package sqlstore_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/storage/sqlstore"
)

// An order placed once in PostgreSQL: the sale's rows and the request's
// record commit in one transaction. It needs a database, so it is
// compiled, not run.
func Example() {
	ctx := context.Background()
	store, err := sqlstore.Open(ctx, "postgres://app@127.0.0.1:5432/shop?sslmode=disable")
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil { // creates the Store's tables if missing
		log.Fatal(err)
	}

	g, err := idem.NewGuard(store)
	if err != nil {
		log.Fatal(err)
	}
	res, replayed, err := g.Do(ctx, idemdriver.ScopedKey("alice", "order-7"), "fingerprint", func(ctx context.Context) ([]byte, error) {
		sale := sqlstore.Effect(func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, "UPDATE stock SET units = units - 1 WHERE sku = $1 AND units > 0", "sku-42")
			return err
		})
		if err := idem.Commit(ctx, sale); err != nil {
			return nil, err
		}
		return []byte("order placed"), nil
	})
	fmt.Println(string(res), replayed, err)
}

// A flash sale's writes as one statement with the record's completion: on
// PostgreSQL the SKU's row is locked only while that statement runs. The
// take refuses the sale (idem.ErrEffectRefused) when no unit is left; the
// order's row is then not written either. Compiled, not run.
func ExampleWrites() {
	ctx := context.Background()
	store, err := sqlstore.Open(ctx, "postgres://app@127.0.0.1:5432/shop?sslmode=disable")
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	g, err := idem.NewGuard(store)
	if err != nil {
		log.Fatal(err)
	}
	res, replayed, err := g.Do(ctx, idemdriver.ScopedKey("alice", "order-8"), "fingerprint", func(ctx context.Context) ([]byte, error) {
		sale := sqlstore.Writes{
			{Query: "INSERT INTO orders (id, sku) VALUES (?, ?)", Args: []any{"order-8", "sku-42"}},
			{Query: "UPDATE stock SET units = units - 1 WHERE sku = ? AND units > 0", Args: []any{"sku-42"}, Refuse: "sold out"},
		}
		if err := idem.Commit(ctx, sale); err != nil {
			return nil, err
		}
		return []byte("order placed"), nil
	})
	fmt.Println(string(res), replayed, err)
}

// A service warms the Store's pool once at start, before it reports
// ready: the first burst of requests then finds connections open and
// the Store's statements prepared. It needs a database, so it is
// compiled, not run.
func ExampleStore_Warm() {
	ctx := context.Background()
	store, err := sqlstore.Open(ctx, "postgres://app@127.0.0.1:5432/shop?sslmode=disable")
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	if err := store.Warm(ctx, 0); err != nil { // 0: as many as the pool may open, less one
		log.Fatal(err)
	}
	// ... start serving, report ready
}
