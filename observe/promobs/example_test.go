package promobs_test

import (
	"context"
	"fmt"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/observe/promobs"
	"github.com/oncekit/oncekit/storage/memstore"
)

// Register the observer, give it to the driver, and every Mutex (and Guard,
// and middleware) on that driver reports to Prometheus.
func Example() {
	metrics := promobs.New()
	reg := prometheus.NewRegistry() // or prometheus.DefaultRegisterer
	reg.MustRegister(metrics)

	store := memstore.New(memstore.WithObserver(metrics))
	m, err := lock.NewMutex(store)
	if err != nil {
		panic(err)
	}
	for range 3 {
		_ = m.Do(context.Background(), "sku:phone-x", func(context.Context, lock.Lease) error { return nil })
	}
	mfs, err := reg.Gather()
	if err != nil {
		panic(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if c := m.GetCounter(); c != nil {
				fmt.Println(mf.GetName(), labels(m.GetLabel()), c.GetValue())
			}
		}
	}
	// Output:
	// oncekit_lock_acquire_total driver=memory outcome=acquired 3
	// oncekit_lock_release_total driver=memory outcome=released 3
}

func labels(ls []*dto.LabelPair) string {
	var out []string
	for _, l := range ls {
		out = append(out, l.GetName()+"="+l.GetValue())
	}
	return strings.Join(out, " ")
}
