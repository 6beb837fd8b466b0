package observe_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/observe"
	"github.com/oncekit/oncekit/storage/memstore"
)

// One observer on the driver: the Guard built on it reports through it. Here
// a slog logger (keys hashed) and a function that counts claims by outcome.
func Example() {
	claims := map[observe.Outcome]int{}
	count := observe.Func(func(_ context.Context, ev observe.Event) {
		if ev.Op == observe.IdemBegin {
			claims[ev.Outcome]++
		}
	})
	logs := observe.Logger(slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		Level: slog.LevelWarn, // failures only
	})))

	store := memstore.New(memstore.WithObserver(observe.Multi(count, logs)))
	guard, err := idem.NewGuard(store)
	if err != nil {
		panic(err)
	}
	run := func(context.Context) ([]byte, error) { return []byte("ok"), nil }
	ctx := context.Background()
	for range 3 {
		_, _, _ = guard.Do(ctx, "order-7", "fp", run)
	}
	_, _, _ = guard.Do(ctx, "order-7", "another request", run)
	fmt.Println(claims)
	// Output:
	// map[acquired:1 mismatch:1 replayed:2]
}
