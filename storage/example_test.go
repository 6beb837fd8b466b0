package storage_test

import (
	"context"
	"fmt"
	"time"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/storage"
)

// One URL opens a store that is both a lock.Locker and an idemdriver.Store:
// here the in-process one; "redis://127.0.0.1:6379" or
// "etcd://127.0.0.1:2379" open the others the same way.
func ExampleOpen() {
	ctx := context.Background()
	st, err := storage.Open(ctx, "memory://")
	if err != nil {
		panic(err)
	}
	defer st.Close()

	m, err := lock.NewMutex(st, lock.WithTTL(5*time.Second))
	if err != nil {
		panic(err)
	}
	err = m.Do(ctx, "sku:phone", func(ctx context.Context, l lock.Lease) error {
		fmt.Println("holding sku:phone, fenced:", l.Fence() > 0)
		return nil
	})
	fmt.Println("lock:", err)

	g, err := idem.NewGuard(st)
	if err != nil {
		panic(err)
	}
	for range 2 {
		res, replayed, err := g.Do(ctx, idemdriver.ScopedKey("alice", "order-1"), "fp", func(context.Context) ([]byte, error) {
			return []byte("order placed"), nil
		})
		fmt.Println(string(res), replayed, err)
	}
	// Output:
	// holding sku:phone, fenced: true
	// lock: <nil>
	// order placed false <nil>
	// order placed true <nil>
}
