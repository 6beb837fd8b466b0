package lead_test

import (
	"context"
	"fmt"
	"time"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/lead"
	"github.com/oncekit/oncekit/storage/memstore"
)

// A loop that must run on one replica at a time: the replica that leads
// runs it, with a context that ends when it stops leading, and the
// lease's fence for what it writes.
func Example() {
	store := memstore.New()
	defer store.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	led := make(chan uint64)
	go lead.Run(ctx, store, "outbox-relay", func(ctx context.Context, l lock.Lease) error {
		led <- l.Fence() // relay.Loop(ctx, l.Fence()): until ctx ends
		<-ctx.Done()
		return nil
	}, lead.WithTTL(10*time.Second))
	fmt.Println("leading, fenced:", <-led > 0)
	// Output: leading, fenced: true
}

// An Elector answers whether this replica leads: gocron's
// WithDistributedElector takes one, and code that asks can too.
func ExampleNewElector() {
	store := memstore.New()
	defer store.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e, err := lead.NewElector(ctx, store, "scheduler")
	if err != nil {
		fmt.Println(err)
		return
	}
	for e.IsLeader(ctx) != nil {
		time.Sleep(time.Millisecond)
	}
	fmt.Println("this replica leads")
	cancel()
	<-e.Done()
	fmt.Println("campaign over:", e.IsLeader(context.Background()))
	// Output:
	// this replica leads
	// campaign over: lead: this replica does not lead
}
