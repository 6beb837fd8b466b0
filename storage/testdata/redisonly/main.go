// A program that opens only Redis: it imports storage and redisstore, and
// so links neither pgx, the MySQL driver, etcd nor ZooKeeper
// (TestOneDriverLinksOneClient). It prints what Open says of a URL whose
// driver it did not import.
package main

import (
	"context"
	"fmt"

	"github.com/oncekit/oncekit/storage"
	_ "github.com/oncekit/oncekit/storage/redisstore"
)

func main() {
	for _, url := range []string{"redis://127.0.0.1:1", "postgres://127.0.0.1:1/db"} {
		st, err := storage.Open(context.Background(), url)
		if err != nil {
			fmt.Println(err)
			continue
		}
		fmt.Printf("%T\n", st)
		_ = st.Close()
	}
}
