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
			// The key is built in a buffer: one allocation (the string
			// the store keeps), so that the figure is the Guard's.
			buf := []byte("k-" + mode)
			prefix := len(buf)
			key := string(buf)
			for i := 0; b.Loop(); i++ {
				if mode == "new-key" {
					buf = strconv.AppendInt(buf[:prefix], int64(i), 10)
					key = string(buf)
				}
				if _, _, err := g.Do(ctx, key, "fp", run); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
