package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/httpmw"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/storage/memstore"
)

// p50 of samples, in microseconds.
func p50us(samples []time.Duration) float64 {
	slices.Sort(samples)
	return float64(samples[len(samples)/2].Nanoseconds()) / 1e3
}

// BenchmarkHTTPMiddleware: requests through httpmw over redisstore, one at
// a time, for new keys and for replays, against the bare handler and a
// Redis PING measured in the same run. added-p50-µs is the middleware's p50
// minus the bare handler's; the goal is at most 2 round trips +
// 50 µs for a new key and 1 round trip + 50 µs for a replay (budget-µs,
// from the p50 of a PING timed after every request). req/s is one client
// at a time: 1 / the mean latency.
func BenchmarkHTTPMiddleware(b *testing.B) {
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/orders/1001")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order":1001,"items":%q}`, body)
	})
	const body = `{"sku":"phone-x","qty":1,"address":"1 Main St"}`
	serve := func(h http.Handler, key string) int {
		req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(body))
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w.Code
	}
	timed := func(n int, f func(i int)) []time.Duration {
		out := make([]time.Duration, n)
		for i := range n {
			start := time.Now()
			f(i)
			out[i] = time.Since(start)
		}
		return out
	}

	// measure serves h once per iteration with key(i), calls after (not
	// timed) after each request, and reports req/s (1 / mean latency) and
	// the p50, which it returns.
	measure := func(b *testing.B, h http.Handler, key func(i int) string, after func()) float64 {
		var samples []time.Duration
		var total time.Duration
		i := 0
		for b.Loop() {
			i++
			start := time.Now()
			if code := serve(h, key(i)); code != http.StatusCreated {
				b.Fatalf("status %d", code)
			}
			d := time.Since(start)
			samples, total = append(samples, d), total+d
			if after != nil {
				after()
			}
		}
		p50 := p50us(samples)
		b.ReportMetric(float64(b.N)/total.Seconds(), "req/s")
		b.ReportMetric(p50, "p50-µs")
		return p50
	}
	// keys returns the key of each request: a new one every time, or one
	// already completed (a replay).
	keys := func(h http.Handler, mode string) func(int) string {
		prefix := benchKey("k")
		serve(h, prefix+"replay") // completes the replay key; loads the scripts
		if mode == "new-key" {
			return func(i int) string { return fmt.Sprintf("%s%d", prefix, i) }
		}
		return func(int) string { return prefix + "replay" }
	}

	b.Run("bare", func(b *testing.B) {
		measure(b, handler, func(int) string { return "" }, nil)
	})
	// The middleware's own cost, without a network: the memory driver.
	for _, mode := range []string{"new-key", "replay"} {
		b.Run("memstore/"+mode, func(b *testing.B) {
			g, err := idem.NewGuard(memstore.New())
			if err != nil {
				b.Fatal(err)
			}
			mw, err := httpmw.New(g, httpmw.Unscoped())
			if err != nil {
				b.Fatal(err)
			}
			h := mw(handler)
			bare := p50us(timed(2000, func(int) { serve(handler, "") }))
			p50 := measure(b, h, keys(h, mode), nil)
			b.ReportMetric(p50-bare, "added-p50-µs")
		})
	}
	for _, mode := range []string{"new-key", "replay"} {
		b.Run("redisstore/"+mode, func(b *testing.B) {
			c, cc := client(b, testenv.RedisAddrs(b, 1)[0])
			mw, err := httpmw.New(redisGuard(b, c, "httpmw"), httpmw.Unscoped())
			if err != nil {
				b.Fatal(err)
			}
			h := mw(handler)
			ctx := context.Background()
			// Calibration in the same run: the bare handler's p50, and a
			// round trip (PING) timed right after every request, so that
			// both see the same machine load.
			bare := p50us(timed(2000, func(int) { serve(handler, "") }))
			key := keys(h, mode)
			var pings []time.Duration
			r0 := cc.n.Load()
			p50 := measure(b, h, key, func() {
				start := time.Now()
				c.Ping(ctx)
				pings = append(pings, time.Since(start))
			})
			rtt := p50us(pings)
			budget := 50 + rtt
			if mode == "new-key" {
				budget += rtt
			}
			b.ReportMetric(p50-bare, "added-p50-µs")
			b.ReportMetric(rtt, "rtt-p50-µs")
			b.ReportMetric(budget, "budget-µs")
			r0 += int64(b.N) // the PINGs
			b.ReportMetric(float64(cc.n.Load()-r0)/float64(b.N), "roundtrips/op")
		})
	}
}
