// Command flashsale is the inventory example's load generator: many buyers
// race for little stock across the replicas of the inventory service, some
// of them sending their order twice, and it prints what happened. It exits
// non-zero when an invariant fails (something oversold, an order run twice,
// a replay that differs, an order without a shipment).
//
//	flashsale --targets http://127.0.0.1:8080,http://127.0.0.1:8081 --buyers 1000 --stock 100
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/oncekit/oncekit/examples/inventory/flashsale"
)

func main() {
	var cfg flashsale.Config
	targets := flag.String("targets", "http://127.0.0.1:8080", "HTTP base URLs of the replicas, comma-separated")
	grpcAddrs := flag.String("grpc", "", "gRPC addresses of the replicas, comma-separated (every other buyer uses gRPC)")
	flag.IntVar(&cfg.Buyers, "buyers", 1000, "buyers")
	flag.Int64Var(&cfg.Stock, "stock", 100, "units for sale")
	flag.Float64Var(&cfg.DupRate, "dup-rate", 0.3, "share of buyers who send their order twice")
	flag.StringVar(&cfg.SKU, "sku", "", "SKU to sell (default a fresh one)")
	flag.DurationVar(&cfg.Shipping, "shipping", 30*time.Second, "wait up to this long for a shipment per order (0: do not check)")
	html := flag.String("html", "", "write the report as HTML to this file")
	flag.Parse()
	cfg.Targets = split(*targets)
	cfg.GRPC = split(*grpcAddrs)
	cfg.Progress = os.Stderr
	if cfg.DupRate == 0 {
		cfg.DupRate = -1 // 0 means none here
	}
	rep, err := flashsale.Run(context.Background(), cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "flashsale:", err)
		os.Exit(1)
	}
	rep.Print(os.Stdout)
	if *html != "" {
		f, err := os.Create(*html)
		if err == nil {
			err = rep.WriteHTML(f)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "flashsale:", err)
			os.Exit(1)
		}
	}
	if !rep.OK() {
		os.Exit(1)
	}
}

func split(s string) []string {
	var out []string
	for p := range strings.SplitSeq(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
