package redisstore_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/storage/redisstore"
)

// A lock and an idempotent run on one Redis server (a Sentinel failover
// client or a *redis.ClusterClient work the same way). It needs a server
// at 127.0.0.1:6379, so it is compiled, not run.
func Example() {
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer client.Close()
	store, err := redisstore.New(client)
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()

	m, err := lock.NewMutex(store, lock.WithTTL(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	err = m.Do(ctx, "sku:42", func(ctx context.Context, l lock.Lease) error {
		fmt.Println("holding sku:42 with fence", l.Fence()) // pass the fence to what you write
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
