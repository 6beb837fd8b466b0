package flashsale

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"text/tabwriter"
	"time"
)

// Report is what a sale did, and whether its invariants held.
type Report struct {
	SKU      string
	Replicas int
	Buyers   int
	Stock    int64 // at the start
	Requests int64 // HTTP and gRPC requests sent, retries and duplicates included

	Confirmed int64 // buyers with an order (201)
	SoldOut   int64 // buyers told sold_out (409)
	Unhandled int64 // buyers with no final answer
	Replays   int64 // responses marked replayed
	Retried   int64 // responses that made a buyer try again (in flight, busy, unavailable)
	Refused   int64 // of which answers that refused the sale's effect (lock or claim lost): must be 0 without faults

	Holds     int64 // buyers who held a unit first (Config.HoldRate)
	Paid      int64 // of which paid: an order
	Abandoned int64 // of which let the hold run out: its unit for sale again
	Held      int64 // units still held at the end: must be 0

	Sold      int64 // units sold, as the item says
	Left      int64 // units left, as the item says
	Oversold  int64 // must be 0
	DupExec   int64 // orders executed more than once: must be 0
	Mismatch  int64 // keys whose answers differ (a replay not identical): must be 0
	Orders    int64 // order records the sale added
	Shipments int64 // shipment records the sale added (-1: not checked)

	P50, P99, Max time.Duration
	Elapsed       time.Duration
	OrdersPerSec  float64

	Failures []string // invariants that failed
	Errors   []string // some requests' errors

	samples []sample
}

// Metrics are the sale's figures for a benchmark's ReportMetric: orders/s,
// requests/s, p50-ms and p99-ms.
func (r *Report) Metrics() map[string]float64 {
	return map[string]float64{
		"orders/s":   float64(r.Confirmed) / r.Elapsed.Seconds(),
		"requests/s": float64(r.Requests) / r.Elapsed.Seconds(),
		"p50-ms":     float64(r.P50.Microseconds()) / 1000,
		"p99-ms":     float64(r.P99.Microseconds()) / 1000,
	}
}

// OK reports whether every invariant held.
func (r *Report) OK() bool { return len(r.Failures) == 0 }

func (run *run) report(ctx context.Context, elapsed time.Duration) (*Report, error) {
	rep := &Report{SKU: run.cfg.SKU, Replicas: len(run.cfg.Targets), Buyers: run.cfg.Buyers, Stock: run.cfg.Stock,
		Requests: run.requests.Load(), Elapsed: elapsed, Shipments: -1, Errors: run.errs, samples: run.samples}

	var item struct{ Stock, Sold, Held int64 }
	if err := run.get(ctx, "/v1/items/"+run.cfg.SKU, &item); err != nil {
		return nil, err
	}
	// Holds their buyers let go end by themselves: their units come back.
	for deadline := time.Now().Add(run.cfg.HoldTTL + 5*time.Second); item.Held > 0 && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
		item.Held = 0 // (the answer leaves out a held count of 0)
		if err := run.get(ctx, "/v1/items/"+run.cfg.SKU, &item); err != nil {
			return nil, err
		}
	}
	rep.Sold, rep.Left, rep.Held = item.Sold, item.Stock, item.Held
	rep.Holds, rep.Paid, rep.Abandoned = run.holds.Load(), run.paid.Load(), run.abandoned.Load()

	for _, answers := range run.answers {
		final := answers[0]
		for _, a := range answers[1:] {
			if a.outcome != failed && (final.outcome == failed || a.body != final.body) {
				if final.outcome != failed {
					rep.Mismatch++
				}
				final = a
			}
		}
		switch final.outcome {
		case created:
			rep.Confirmed++
		case soldOut:
			rep.SoldOut++
		case abandoned:
		default:
			rep.Unhandled++
		}
	}
	rep.Unhandled += int64(run.cfg.Buyers - len(run.answers))

	lat := make([]time.Duration, 0, len(run.samples))
	for _, s := range run.samples {
		if s.replayed {
			rep.Replays++
		}
		if s.outcome == retryable {
			rep.Retried++
			continue
		}
		lat = append(lat, s.latency)
	}
	slices.Sort(lat)
	if n := len(lat); n > 0 {
		rep.P50, rep.P99, rep.Max = lat[n/2], lat[min(n-1, n*99/100)], lat[n-1]
	}
	rep.OrdersPerSec = float64(rep.Confirmed) / elapsed.Seconds()

	var stats struct{ Orders, Shipments int64 }
	if err := run.get(ctx, "/v1/stats", &stats); err != nil {
		return nil, err
	}
	rep.Orders = stats.Orders - run.before.Orders
	if run.cfg.Shipping > 0 {
		deadline := time.Now().Add(run.cfg.Shipping)
		for stats.Shipments-run.before.Shipments < stats.Orders-run.before.Orders && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
			if err := run.get(ctx, "/v1/stats", &stats); err != nil {
				return nil, err
			}
		}
		rep.Orders, rep.Shipments = stats.Orders-run.before.Orders, stats.Shipments-run.before.Shipments
	}
	rep.Refused = run.refused.Load()
	rep.check(run.cfg.AllowRefused)
	return rep, nil
}

// check fills Failures.
func (r *Report) check(allowRefused bool) {
	fail := func(format string, args ...any) { r.Failures = append(r.Failures, fmt.Sprintf(format, args...)) }
	if r.Refused > 0 && !allowRefused {
		fail("%d answers refused a sale's effect (effect_refused or conflict: a live holder's fence or claim refused)", r.Refused)
	}
	if r.Sold > r.Stock || r.Left < 0 {
		r.Oversold = max(r.Sold-r.Stock, -r.Left)
		fail("oversold: %d units sold of %d (%d left)", r.Sold, r.Stock, r.Left)
	}
	if r.Sold+r.Left+r.Held != r.Stock {
		fail("stock does not add up: %d sold + %d left + %d held != %d", r.Sold, r.Left, r.Held, r.Stock)
	}
	if r.Held > 0 {
		fail("%d units still held after every hold ran out", r.Held)
	}
	if r.Unhandled > 0 {
		fail("%d buyers got no final answer", r.Unhandled)
	}
	if r.Unhandled == 0 && r.Sold > r.Confirmed {
		r.DupExec = r.Sold - r.Confirmed
		fail("%d duplicate executions: %d units sold for %d confirmed orders", r.DupExec, r.Sold, r.Confirmed)
	}
	if r.Sold < r.Confirmed {
		fail("lost sales: %d orders confirmed, %d units sold", r.Confirmed, r.Sold)
	}
	// A unit whose hold ran out late may find no buyer left: only a sale
	// without abandoned holds must sell out.
	if want := min(r.Stock, int64(r.Buyers)); r.Unhandled == 0 && r.Abandoned == 0 && r.Sold != want {
		fail("%d units sold, want %d: buyers were told sold_out while stock was left", r.Sold, want)
	}
	if r.Mismatch > 0 {
		fail("%d keys got answers that differ (replays must be identical)", r.Mismatch)
	}
	if r.Orders != r.Sold {
		fail("%d order records for %d units sold", r.Orders, r.Sold)
	}
	if r.Shipments >= 0 && r.Shipments != r.Orders {
		fail("%d shipments for %d orders", r.Shipments, r.Orders)
	}
}

// Print writes the report as a table.
func (r *Report) Print(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(k string, v any) { fmt.Fprintf(tw, "  %s\t%v\n", k, v) }
	row("sku", r.SKU)
	row("replicas", r.Replicas)
	row("buyers", r.Buyers)
	row("stock", r.Stock)
	row("requests", r.Requests)
	row("orders confirmed (201)", r.Confirmed)
	row("sold out (409)", r.SoldOut)
	row("replays", r.Replays)
	row("retried answers", r.Retried)
	row("refused effects (409)", r.Refused)
	if r.Holds > 0 {
		row("holds: paid / let run out", fmt.Sprintf("%d: %d / %d", r.Holds, r.Paid, r.Abandoned))
	}
	row("units sold / left", fmt.Sprintf("%d / %d", r.Sold, r.Left))
	row("oversold", r.Oversold)
	row("duplicate executions", r.DupExec)
	row("differing replays", r.Mismatch)
	if r.Shipments >= 0 {
		row("shipments / orders", fmt.Sprintf("%d / %d", r.Shipments, r.Orders))
	} else {
		row("orders", r.Orders)
	}
	row("latency p50 / p99 / max", fmt.Sprintf("%v / %v / %v", r.P50.Round(time.Microsecond), r.P99.Round(time.Microsecond), r.Max.Round(time.Microsecond)))
	row("orders/s", fmt.Sprintf("%.0f", r.OrdersPerSec))
	row("elapsed", r.Elapsed.Round(time.Millisecond))
	tw.Flush()
	if r.OK() {
		fmt.Fprintln(w, "PASS: nothing oversold, no order run twice, every replay identical"+map[bool]string{true: ", a shipment per order", false: ""}[r.Shipments >= 0])
		return
	}
	for _, f := range r.Failures {
		fmt.Fprintln(w, "FAIL:", f)
	}
	for _, e := range r.Errors {
		fmt.Fprintln(w, "  error:", e)
	}
}

func (run *run) get(ctx context.Context, path string, v any) error {
	var last error
	for i := range 10 {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, run.cfg.Targets[i%len(run.cfg.Targets)]+path, nil)
		resp, err := run.client.Do(req)
		if err == nil {
			err = func() error {
				defer resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					b, _ := io.ReadAll(resp.Body)
					return fmt.Errorf("GET %s: %s: %s", path, resp.Status, b)
				}
				return json.NewDecoder(resp.Body).Decode(v)
			}()
		}
		if err == nil {
			return nil
		}
		last = err
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("flashsale: %w", last)
}
