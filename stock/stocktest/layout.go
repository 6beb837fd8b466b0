package stocktest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/oncekit/oncekit/stock"
	"github.com/oncekit/oncekit/stock/stockdriver"
)

// Golden is the state every driver's golden stored layout holds for one
// item, written in the driver's own layout by a released version (the
// driver's testdata): 10 units put; key "k-sold" took 3 (sold); key
// "k-out" wanted 1 and was told sold out; key "h1" holds 2 for an hour;
// 5 are free. A later version must read it so.
const (
	GoldenPut, GoldenFree, GoldenHeld, GoldenSold = 10, 5, 2, 3
)

// CheckLayout plants the golden item with plant (the driver writes its
// released layout's values under item, its hold ending an hour from now
// by the store's clock) and checks that store reads it as it was meant: the
// level, each key's answer replayed, the hold confirmed.
func CheckLayout(t *testing.T, store stockdriver.Store, plant func(t *testing.T, item string)) {
	t.Helper()
	st, err := stock.New(store)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	it := item(t)
	plant(t, it)
	if l, err := st.Level(ctx, it); err != nil || l != (stock.Level{Put: GoldenPut, Free: GoldenFree, Held: GoldenHeld, Sold: GoldenSold}) {
		t.Fatalf("the golden item reads %+v, %v", l, err)
	}
	if sale, err := st.Take(ctx, it, "k-sold", 3); err != nil || !sale.Replayed || sale.Units != 3 {
		t.Errorf("k-sold's take: %+v, %v; want its answer replayed", sale, err)
	}
	var so *stock.SoldOutError
	if _, err := st.Take(ctx, it, "k-out", 1); !errors.As(err, &so) || !so.Replayed {
		t.Errorf("k-out's take: %v; want sold out, replayed", err)
	}
	if sale, err := st.Confirm(ctx, it, "h1"); err != nil || sale.Units != 2 {
		t.Errorf("h1's hold confirmed: %+v, %v", sale, err)
	}
	if l, err := st.Level(ctx, it); err != nil || l != (stock.Level{Put: GoldenPut, Free: GoldenFree, Sold: GoldenSold + GoldenHeld}) {
		t.Errorf("after the confirm: %+v, %v", l, err)
	}
}
