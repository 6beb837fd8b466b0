package idemdriver_test

import (
	"context"
	"fmt"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/storage/memstore"
)

// A middleware's key: the client's key checked by its rules, then made
// into a stored Key — scoped, hashed and placed — whose text the Guard
// runs under; a sharded driver reads its place from it.
func ExampleStoredKey() {
	ctx := context.Background()
	st := memstore.New()
	defer st.Close()
	g, err := idem.NewGuard(st)
	if err != nil {
		panic(err)
	}
	client := "order-1" // an Idempotency-Key header, say
	if err := idemdriver.CheckClientKey(client); err != nil {
		panic(err) // a 400 in a real handler
	}
	k, err := idemdriver.StoredKey("alice", "", client, "sku-9")
	if err != nil {
		panic(err)
	}
	fmt.Println(k.Place(), len(k.String()))
	res, _, err := g.Do(ctx, k.String(), "fp", func(ctx context.Context) ([]byte, error) {
		key, _ := idem.KeyFrom(ctx)
		return []byte(key[:12]), nil
	})
	fmt.Println(string(res), err)
	// Output:
	// sku-9 76
	// {sku-9}idem: <nil>
}
