package idem_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/storage/memstore"
)

// A run that charges a card through a payment provider: the first attempt
// times out after the provider took the charge; the retry, attempt 2, asks
// the provider before it charges again.
func ExampleAttemptFrom() {
	g, err := idem.NewGuard(memstore.New())
	if err != nil {
		panic(err)
	}
	charged := map[string]bool{} // the payment provider's side
	charge := func(ctx context.Context) ([]byte, error) {
		key, _ := idem.KeyFrom(ctx)
		if n, _ := idem.AttemptFrom(ctx); n > 1 && charged[key] {
			return fmt.Appendf(nil, "attempt %d: the earlier charge went through", n), nil
		}
		charged[key] = true
		return nil, errors.New("payment provider: timeout") // though the charge went through
	}
	key := idemdriver.ScopedKey("customer-42", "order-7f3a")
	for range 2 {
		res, _, err := g.Do(context.Background(), key, "fp", charge)
		if err != nil {
			fmt.Println("error:", err)
			continue
		}
		fmt.Println(string(res))
	}
	// Output:
	// error: payment provider: timeout
	// attempt 2: the earlier charge went through
}
