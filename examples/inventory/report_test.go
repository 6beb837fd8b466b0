package inventory_test

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oncekit/oncekit/examples/inventory"
	"github.com/oncekit/oncekit/stock"
	"github.com/oncekit/oncekit/storage/memstore"
)

// lockedBuffer is a bytes.Buffer for several writers.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// Three replicas of one inventory report each tick once between them.
func TestReportOncePerTickAcrossReplicas(t *testing.T) {
	store := memstore.New()
	defer store.Close()
	sales, err := stock.New(store)
	if err != nil {
		t.Fatal(err)
	}
	backend := inventory.NewMemory(inventory.NewStocked(sales, ""))
	var out lockedBuffer
	ctx, cancel := context.WithTimeout(t.Context(), 1300*time.Millisecond)
	defer cancel()
	var wg sync.WaitGroup
	for range 3 {
		svc, err := inventory.New(inventory.Config{Store: store, Backend: backend, ReportEvery: 200 * time.Millisecond, ReportTo: &out})
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() { _ = svc.Report(ctx) })
	}
	wg.Wait()
	out.mu.Lock()
	defer out.mu.Unlock()
	lines := strings.Split(strings.TrimSpace(out.b.String()), "\n")
	seen := map[string]int{}
	for _, l := range lines {
		if !strings.HasPrefix(l, "inventory report at ") || !strings.HasSuffix(l, "0 orders, 0 shipped, 0 awaiting shipment") {
			t.Errorf("report line %q", l)
		}
		seen[strings.Fields(l)[3]]++
	}
	if len(seen) < 4 {
		t.Errorf("%d ticks reported in 1.3 s of 200 ms ticks:\n%s", len(seen), out.b.String())
	}
	for tick, n := range seen {
		if n != 1 {
			t.Errorf("tick %s reported %d times", tick, n)
		}
	}
}
