package integration_test

import (
	"context"
	"testing"

	"github.com/oncekit/oncekit/examples/inventory/flashsale"
)

// BenchmarkFlashSale is the flash sale's real bottleneck: three inventory
// replica processes selling one hot SKU, with the per-SKU lock and without
// it (--lock-free: the sale script checks and takes the stock itself).
// Each iteration is one buyer; stock is a fifth of the buyers, 30 % of
// buyers send their order twice. orders/s counts confirmed orders; the
// latencies are per request. Every sale must keep its invariants.
//
//	go test -run '^$' -bench FlashSale -benchtime 2000x ./integration
func BenchmarkFlashSale(b *testing.B) {
	redis := stores(b)
	for _, store := range []string{"redis", "redlock", "postgres", "mysql"} {
		for _, mode := range []string{"locked", "lock-free"} {
			b.Run(store+"/"+mode, func(b *testing.B) {
				flags := []string{"--lock-free=false"} // deploy sells lock-free on SQL otherwise
				if mode == "lock-free" {
					flags = []string{"--lock-free"}
				}
				d := deploy(b, redis[store], 3, flags...)
				b.ResetTimer()
				rep, err := flashsale.Run(context.Background(), flashsale.Config{Targets: d.httpTargets,
					Buyers: b.N, Stock: int64(max(1, b.N/5)), DupRate: 0.3, Attempts: 60})
				b.StopTimer()
				if err != nil {
					b.Fatal(err)
				}
				if !rep.OK() {
					b.Fatalf("the sale broke an invariant: %v", rep.Failures)
				}
				for unit, v := range rep.Metrics() {
					b.ReportMetric(v, unit)
				}
			})
		}
	}
}
