package zkstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/oncekit/oncekit/stock"
	"github.com/oncekit/oncekit/stock/stockdriver"
	"github.com/oncekit/oncekit/stock/stocktest"
)

func TestStock(t *testing.T) {
	t.Parallel()
	stocktest.Run(t, stocktest.Config{
		NewStore: func(t *testing.T) stockdriver.Store { return connect(t) },
		Process:  true,
	})
}

// Cleanup forgets the stock records whose memory has passed, never a
// live hold.
func TestStockCleanup(t *testing.T) {
	t.Parallel()
	s := connect(t)
	st, err := stock.New(s, stock.WithMemory(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	item := "cleanup-" + time.Now().Format(time.RFC3339Nano)
	if _, err := st.Put(ctx, item, 5); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Take(ctx, item, "t", 1); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Hold(ctx, item, "h", 1, time.Hour); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond) // the take's memory (1 ms) is what ends
	if _, err := s.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	if sale, err := st.Take(ctx, item, "t", 1); err != nil || sale.Replayed {
		t.Fatalf("Take of a forgotten key = %+v, %v; want a new take", sale, err)
	}
	if err := st.Release(ctx, item, "h"); err != nil {
		t.Fatalf("Release of the hold the cleanup kept: %v", err)
	}
	if l, err := st.Level(ctx, item); err != nil || l != (stock.Level{Put: 5, Free: 3, Sold: 2}) {
		t.Fatalf("Level = %+v, %v", l, err)
	}
}
