package zkstore_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/storage/zkstore"
)

// A lock and an idempotent run on a ZooKeeper ensemble.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	store, err := zkstore.Connect(ctx, []string{"127.0.0.1:2181", "127.0.0.1:2182", "127.0.0.1:2183"},
		zkstore.WithSessionTimeout(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()

	m, err := lock.NewMutex(store, lock.WithTTL(30*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	err = m.Do(ctx, "sku:42", func(ctx context.Context, l lock.Lease) error {
		fmt.Println("holding sku:42 with fence", l.Fence())
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}

	g, err := idem.NewGuard(store)
	if err != nil {
		log.Fatal(err)
	}
	res, replayed, err := g.Do(ctx, "order:7", "fingerprint", func(ctx context.Context) ([]byte, error) {
		return []byte("charged"), nil
	})
	fmt.Println(string(res), replayed, err)
}
