package idem_test

import (
	"context"
	"fmt"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/storage/memstore"
)

// A middleware's key: the client's key checked by its rules, then made
// into a stored Key — scoped, hashed and placed — and run with DoKey. The
// Key is not checked again on its way to the store, and a sharded driver
// reads its place from it.
func ExampleStoredKey() {
	ctx := context.Background()
	st := memstore.New()
	defer st.Close()
	g, err := idem.NewGuard(st)
	if err != nil {
		panic(err)
	}
	client := "order-1" // an Idempotency-Key header, say
	if err := idem.CheckClientKey(client); err != nil {
		panic(err) // a 400 in a real handler
	}
	k, err := idem.StoredKey("alice", "", client, "sku-9")
	if err != nil {
		panic(err)
	}
	fmt.Println(k.Place(), len(k.String()))
	res, _, err := g.DoKey(ctx, k, "fp", func(ctx context.Context) ([]byte, error) {
		key, _ := idem.KeyFrom(ctx)
		return []byte(key[:12]), nil
	})
	fmt.Println(string(res), err)
	// Output:
	// sku-9 76
	// {sku-9}idem: <nil>
}
