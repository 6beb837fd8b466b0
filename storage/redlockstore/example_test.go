package redlockstore_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/storage/redlockstore"
)

// A lock on a majority of three independent Redis servers. It needs the
// servers, so it is compiled, not run.
func Example() {
	ctx := context.Background()
	var clients []*redis.Client
	for _, addr := range []string{"127.0.0.1:6379", "127.0.0.1:6380", "127.0.0.1:6381"} {
		c := redis.NewClient(&redis.Options{Addr: addr})
		defer c.Close()
		clients = append(clients, c)
	}
	store, err := redlockstore.New(redlockstore.FromClients(clients...))
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()

	m, err := lock.NewMutex(store, lock.WithTTL(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	err = m.Do(ctx, "sku:42", func(ctx context.Context, l lock.Lease) error {
		fmt.Println("holding sku:42 on", store.Quorum(), "nodes or more, fence", l.Fence())
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
}
