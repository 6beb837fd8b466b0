package stock_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/oncekit/oncekit/stock"
	"github.com/oncekit/oncekit/storage/memstore"
)

// A flash sale: three units, four buyers, one of them retrying.
func Example() {
	ctx := context.Background()
	sales, err := stock.New(memstore.New())
	if err != nil {
		panic(err)
	}
	if _, err := sales.Put(ctx, "phone-x", 3); err != nil {
		panic(err)
	}
	for _, order := range []string{"o-1", "o-2", "o-2", "o-3", "o-4"} {
		sale, err := sales.Take(ctx, "phone-x", order, 1)
		switch {
		case errors.Is(err, stock.ErrSoldOut):
			fmt.Println(order, "sold out")
		case err != nil:
			panic(err)
		default:
			fmt.Println(order, "sold, replayed:", sale.Replayed, "left:", sale.Free)
		}
	}
	// Output:
	// o-1 sold, replayed: false left: 2
	// o-2 sold, replayed: false left: 1
	// o-2 sold, replayed: true left: 1
	// o-3 sold, replayed: false left: 0
	// o-4 sold out
}

// Hold, then pay: a hold that is not confirmed in time gives its units
// back by itself.
func ExampleStock_Hold() {
	ctx := context.Background()
	sales, err := stock.New(memstore.New())
	if err != nil {
		panic(err)
	}
	if _, err := sales.Put(ctx, "seat-12A", 1); err != nil {
		panic(err)
	}
	if _, err := sales.Hold(ctx, "seat-12A", "cart-1", 1, 50*time.Millisecond); err != nil {
		panic(err)
	}
	if _, err := sales.Take(ctx, "seat-12A", "cart-2", 1); errors.Is(err, stock.ErrSoldOut) {
		fmt.Println("cart-2: held by someone else")
	}
	time.Sleep(100 * time.Millisecond) // cart-1 never pays
	if _, err := sales.Confirm(ctx, "seat-12A", "cart-1"); errors.Is(err, stock.ErrHoldExpired) {
		fmt.Println("cart-1: too late")
	}
	lvl, _ := sales.Level(ctx, "seat-12A")
	fmt.Printf("free %d, held %d, sold %d\n", lvl.Free, lvl.Held, lvl.Sold)
	// Output:
	// cart-2: held by someone else
	// cart-1: too late
	// free 1, held 0, sold 0
}
