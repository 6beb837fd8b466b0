package idem_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/storage/memstore"
)

// BenchmarkGuardCost: Guard.Do over memstore (no network), a new key and
// a replay: what the Guard itself costs per call, in time and
// allocations.
func BenchmarkGuardCost(b *testing.B) {
	g, err := idem.NewGuard(memstore.New())
	if err != nil {
		b.Fatal(err)
	}
	result := []byte(`{"order":"o-1"}`)
	run := func(context.Context) ([]byte, error) { return result, nil }
	ctx := context.Background()
	for _, mode := range []string{"new-key", "replay"} {
		b.Run(mode, func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				key := "k-" + mode
				if mode == "new-key" {
					key += strconv.Itoa(i)
				}
				if _, _, err := g.Do(ctx, key, "fp", run); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
