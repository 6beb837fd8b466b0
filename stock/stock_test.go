package stock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/stock"
	"github.com/oncekit/oncekit/stock/stockdriver"
	"github.com/oncekit/oncekit/storage/memstore"
)

// Inside a Guard run, an empty key is the run's: the run's retry after a
// crash (here: the same key taken again) finds the take done.
func TestEmptyKeyIsTheRunsKey(t *testing.T) {
	ctx := t.Context()
	store := memstore.New()
	sales, err := stock.New(store)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sales.Put(ctx, "phone", 2); err != nil {
		t.Fatal(err)
	}
	g, err := idem.NewGuard(store)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := g.Do(ctx, "order-1", "fp", func(ctx context.Context) ([]byte, error) {
		_, err := sales.Take(ctx, "phone", "", 1)
		return nil, err
	}); err != nil {
		t.Fatal(err)
	}
	if sale, err := sales.Take(ctx, "phone", "order-1", 1); err != nil || !sale.Replayed {
		t.Fatalf("Take with the run's key = %+v, %v; want the run's take, replayed", sale, err)
	}
	if _, err := sales.Take(ctx, "phone", "", 1); !errors.Is(err, stock.ErrInvalid) {
		t.Fatalf("Take with an empty key outside a run: %v, want ErrInvalid", err)
	}
}

// gated is a store whose calls wait for the test's go-ahead.
type gated struct {
	stockdriver.Store
	entered chan struct{}
	gate    chan struct{}
}

func (g *gated) ApplyStock(ctx context.Context, item string, ops []stockdriver.Op) (stockdriver.Answer, error) {
	g.entered <- struct{}{}
	<-g.gate
	return g.Store.ApplyStock(ctx, item, ops)
}

// A take whose caller gives up while it waits for the call in flight is
// never sent, and the takes behind it go on.
func TestCancelledWhileQueued(t *testing.T) {
	ctx := t.Context()
	mem := memstore.New()
	direct, err := stock.New(mem)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := direct.Put(ctx, "phone", 5); err != nil {
		t.Fatal(err)
	}
	g := &gated{Store: mem, entered: make(chan struct{}, 8), gate: make(chan struct{})}
	sales, err := stock.New(g)
	if err != nil {
		t.Fatal(err)
	}
	first := make(chan error, 1)
	go func() { _, err := sales.Take(ctx, "phone", "a", 1); first <- err }()
	<-g.entered // a's call is in flight
	cctx, cancel := context.WithCancel(ctx)
	second := make(chan error, 1)
	go func() { _, err := sales.Take(cctx, "phone", "b", 1); second <- err }()
	third := make(chan error, 1)
	time.Sleep(20 * time.Millisecond) // b queues behind a
	go func() { _, err := sales.Take(ctx, "phone", "c", 1); third <- err }()
	time.Sleep(20 * time.Millisecond) // c queues behind b
	cancel()
	if err := <-second; !errors.Is(err, context.Canceled) {
		t.Fatalf("the cancelled take: %v, want context.Canceled", err)
	}
	close(g.gate)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if err := <-third; err != nil {
		t.Fatal(err)
	}
	if l, err := direct.Level(ctx, "phone"); err != nil || l.Sold != 2 {
		t.Fatalf("Level = %+v, %v; want 2 sold (a and c)", l, err)
	}
	if _, err := direct.Take(ctx, "phone", "b", 2); err != nil {
		t.Fatalf("b's key, never sent, takes anew: %v", err)
	}
}
