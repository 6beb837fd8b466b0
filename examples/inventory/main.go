package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/observe/promobs"
	"github.com/oncekit/oncekit/storage/memstore"
	"github.com/oncekit/oncekit/storage/redisstore"
)

func main() {
	buyers := flag.Int("buyers", 200, "buyer goroutines")
	stock := flag.Int("stock", 50, "units for sale")
	retries := flag.Int("retries", 2, "extra submissions of each order with the same order ID")
	redisAddr := flag.String("redis", "", "lock through this Redis server instead of the embedded driver")
	flag.Parse()
	if err := run(*buyers, *stock, *retries, *redisAddr); err != nil {
		fmt.Fprintln(os.Stderr, "inventory:", err)
		os.Exit(1)
	}
}

func run(buyers, stock, retries int, redisAddr string) error {
	if buyers < 1 || stock < 0 || retries < 0 {
		return fmt.Errorf("need -buyers ≥ 1, -stock ≥ 0, -retries ≥ 0")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// The driver reports to Prometheus; the Mutex and the Guard built on it
	// report through it.
	metrics := promobs.New()
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics)

	// Every oncekit driver is both a lock.Locker and an idem.Store.
	var store interface {
		lock.Locker
		idem.Store
	} = memstore.New(memstore.WithObserver(metrics))
	driver := "memstore (embedded)"
	if redisAddr != "" {
		client := redis.NewClient(&redis.Options{Addr: redisAddr})
		defer client.Close()
		rs, err := redisstore.New(client, redisstore.WithObserver(metrics))
		if err != nil {
			return err
		}
		defer rs.Close()
		store, driver = rs, "redisstore "+redisAddr
	}
	m, err := lock.NewMutex(store, lock.WithTTL(5*time.Second))
	if err != nil {
		return err
	}
	// Duplicates of an order in flight wait for its outcome and replay it.
	g, err := idem.NewGuard(store, idem.WithWait(30*time.Second))
	if err != nil {
		return err
	}
	r := RunSale(ctx, g, m, buyers, stock, retries)
	fmt.Printf("driver: %s\n%s\n", driver, r)
	if err := printMetrics(reg); err != nil {
		return err
	}
	if !r.OK() {
		return fmt.Errorf("invariant failed")
	}
	return nil
}

// printMetrics prints the counters the sale left in the registry, as a
// Prometheus scrape would see them.
func printMetrics(reg prometheus.Gatherer) error {
	mfs, err := reg.Gather()
	if err != nil {
		return err
	}
	fmt.Println("oncekit metrics:")
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			labels := ""
			for _, lp := range m.GetLabel() {
				if lp.GetName() != "driver" {
					labels += lp.GetName() + "=" + lp.GetValue() + " "
				}
			}
			switch {
			case m.GetCounter() != nil:
				fmt.Printf("  %-40s %-22s %6.0f\n", mf.GetName(), labels, m.GetCounter().GetValue())
			case m.GetHistogram() != nil:
				h := m.GetHistogram()
				mean := 0.0
				if h.GetSampleCount() > 0 {
					mean = h.GetSampleSum() / float64(h.GetSampleCount())
				}
				fmt.Printf("  %-40s %-22s %6d  mean %s\n", mf.GetName(), labels, h.GetSampleCount(),
					time.Duration(mean*float64(time.Second)).Round(time.Microsecond))
			}
		}
	}
	return nil
}
