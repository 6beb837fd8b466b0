package etcdstore_test

import (
	"context"
	"fmt"
	"log"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/storage/etcdstore"
)

// A lock and an idempotent run on an etcd cluster. It needs a server at
// 127.0.0.1:2379, so it is compiled, not run.
func Example() {
	ctx := context.Background()
	client, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:2379"}, DialTimeout: 3 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	store, err := etcdstore.New(client)
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close() // revokes the Store's sessions: its keys go at once

	m, err := lock.NewMutex(store, lock.WithTTL(10*time.Second))
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
