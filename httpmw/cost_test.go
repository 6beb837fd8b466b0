package httpmw_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/httpmw"
	"github.com/oncekit/oncekit/storage/memstore"
)

// BenchmarkMiddlewareCost: the middleware called directly (no network)
// over memstore, for a new key and a replay: what it costs per request,
// in time and allocations.
func BenchmarkMiddlewareCost(b *testing.B) {
	g, err := idem.NewGuard(memstore.New())
	if err != nil {
		b.Fatal(err)
	}
	mw, err := httpmw.New(g, httpmw.Unscoped())
	if err != nil {
		b.Fatal(err)
	}
	bare := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"order":"o-1"}`)
	})
	h := mw(bare)
	const body = `{"sku":"phone-x","qty":1}`
	// bare: the handler alone, through the same request and recorder:
	// subtract it to get the middleware's own cost.
	for _, mode := range []string{"bare", "new-key", "replay"} {
		h := h
		if mode == "bare" {
			h = bare
		}
		b.Run(mode, func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				key := "k-" + mode
				if mode == "new-key" {
					key += strconv.Itoa(i)
				}
				r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(body))
				r.Header.Set("Content-Type", "application/json")
				r.Header.Set("Idempotency-Key", key)
				w := httptest.NewRecorder()
				h.ServeHTTP(w, r)
				if w.Code != http.StatusCreated {
					b.Fatalf("status %d: %s", w.Code, w.Body)
				}
			}
		})
	}
}
