package memstore_test

import (
	"context"
	"fmt"
	"time"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/storage/memstore"
)

// A lock and an idempotent run in one process: the embedded store, for a
// single-process service, a demo or the tests of code that uses oncekit.
func Example() {
	ctx := context.Background()
	store := memstore.New()
	defer store.Close()

	m, err := lock.NewMutex(store, lock.WithTTL(5*time.Second))
	if err != nil {
		panic(err)
	}
	err = m.Do(ctx, "sku:42", func(ctx context.Context, l lock.Lease) error {
		fmt.Println("holding", l.Key(), "fenced:", l.Fence() > 0)
		return nil
	})
	fmt.Println("lock:", err)

	g, err := idem.NewGuard(store)
	if err != nil {
		panic(err)
	}
	for range 2 {
		res, replayed, err := g.Do(ctx, "order:7", "fingerprint", func(ctx context.Context) ([]byte, error) {
			return []byte("charged"), nil
		})
		fmt.Println(string(res), replayed, err)
	}
	// Output:
	// holding sku:42 fenced: true
	// lock: <nil>
	// charged false <nil>
	// charged true <nil>
}
