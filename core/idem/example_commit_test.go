package idem_test

import (
	"context"
	"fmt"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/storage/memstore"
)

// A run's effect commits with its record: the stock goes down and the
// order's result is stored in one step, so the duplicate replays the
// result and the stock goes down once. On Redis the effect is a
// redisstore.Effect (a Lua script), on SQL a sqlstore.Effect (a function
// of the transaction), on etcd and ZooKeeper one transaction.
func ExampleCommit() {
	ctx := context.Background()
	st := memstore.New()
	defer st.Close()
	g, err := idem.NewGuard(st)
	if err != nil {
		panic(err)
	}
	stock := 10
	for range 2 {
		res, replayed, err := g.Do(ctx, idemdriver.ScopedKey("alice", "order-1"), "fp", func(ctx context.Context) ([]byte, error) {
			sell := memstore.Effect(func() error {
				if stock == 0 {
					return fmt.Errorf("sold out")
				}
				stock--
				return nil
			})
			if err := idem.Commit(ctx, sell); err != nil {
				return nil, err
			}
			return []byte("order placed"), nil
		})
		fmt.Println(string(res), replayed, err, "stock", stock)
	}
	// Output:
	// order placed false <nil> stock 9
	// order placed true <nil> stock 9
}
