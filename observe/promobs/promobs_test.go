package promobs_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/observe"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/observe/promobs"
	"github.com/oncekit/oncekit/stock"
	"github.com/oncekit/oncekit/storage/memstore"
	"github.com/oncekit/oncekit/storage/redisstore"
)

// A scripted scenario on the memory driver, then the metrics as a scrape
// of the registry sees them.
func TestScenarioMetrics(t *testing.T) {
	metrics := promobs.New()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(metrics)
	ctx := t.Context()

	store := memstore.New(memstore.WithObserver(metrics))
	m, err := lock.NewMutex(store, lock.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	first, err := m.Lock(ctx, "sku-1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.TryLock(ctx, "sku-1"); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("TryLock of a held key: %v", err)
	}
	next := make(chan lock.Held)
	go func() {
		h, err := m.Lock(ctx, "sku-1")
		if err != nil {
			t.Error(err)
		}
		next <- h
	}()
	waitFor(t, func() bool { info, _ := store.InspectLock(ctx, "sku-1"); return info.Waiters == 1 })
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	second := <-next // handed off locally
	if _, err := store.ForceRelease(ctx, "sku-1"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-second.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("a forced release did not end the Mutex's lease")
	}
	if err := second.Release(ctx); !errors.Is(err, lock.ErrLockLost) {
		t.Errorf("Release of a lost lease: %v", err)
	}

	g, err := idem.NewGuard(store)
	if err != nil {
		t.Fatal(err)
	}
	ok := func(context.Context) ([]byte, error) { return []byte("ok"), nil }
	if _, _, err := g.Do(ctx, "order-1", "fp", ok); err != nil {
		t.Fatal(err)
	}
	if _, replayed, err := g.Do(ctx, "order-1", "fp", ok); err != nil || !replayed {
		t.Fatalf("duplicate: replayed %v, %v", replayed, err)
	}
	if _, _, err := g.Do(ctx, "order-1", "other", ok); !errors.Is(err, idem.ErrMismatch) {
		t.Fatalf("other fingerprint: %v", err)
	}
	if _, _, err := g.Do(ctx, "order-2", "fp", func(context.Context) ([]byte, error) {
		return nil, errors.New("payment declined")
	}); err == nil {
		t.Fatal("failing run: no error")
	}
	running, release := make(chan struct{}), make(chan struct{})
	done := make(chan error)
	go func() {
		_, _, err := g.Do(ctx, "order-3", "fp", func(context.Context) ([]byte, error) {
			close(running)
			<-release
			return []byte("ok"), nil
		})
		done <- err
	}()
	<-running
	if _, _, err := g.Do(ctx, "order-3", "fp", ok); !errors.Is(err, idem.ErrInFlight) {
		t.Fatalf("duplicate in flight: %v", err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// A store that cannot be reached: a Redis client on a closed port.
	testenv.QuietRedisDialErrors()
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { _ = client.Close() })
	down, err := redisstore.New(client, redisstore.WithObserver(metrics))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = down.Close() })
	gd, err := idem.NewGuard(down)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := gd.Do(ctx, "order-4", "fp", ok); err == nil {
		t.Fatal("Do on an unreachable store: no error")
	}

	const counters = `
# HELP oncekit_idem_claims_total Idempotency claims by outcome.
# TYPE oncekit_idem_claims_total counter
oncekit_idem_claims_total{driver="memory",outcome="abandoned"} 1
oncekit_idem_claims_total{driver="memory",outcome="acquired"} 3
oncekit_idem_claims_total{driver="memory",outcome="in_flight"} 1
oncekit_idem_claims_total{driver="memory",outcome="mismatch"} 1
oncekit_idem_claims_total{driver="memory",outcome="replayed"} 1
oncekit_idem_claims_total{driver="memory",outcome="stored"} 2
# HELP oncekit_lock_acquire_total Lock acquisitions by outcome.
# TYPE oncekit_lock_acquire_total counter
oncekit_lock_acquire_total{driver="memory",outcome="acquired"} 2
oncekit_lock_acquire_total{driver="memory",outcome="busy"} 1
# HELP oncekit_lock_lost_total Leases lost while held.
# TYPE oncekit_lock_lost_total counter
oncekit_lock_lost_total{driver="memory"} 1
# HELP oncekit_lock_release_total Lease releases by outcome.
# TYPE oncekit_lock_release_total counter
oncekit_lock_release_total{driver="memory",outcome="lost"} 1
oncekit_lock_release_total{driver="memory",outcome="released"} 1
# HELP oncekit_store_errors_total Operations the store failed or could not be reached for.
# TYPE oncekit_store_errors_total counter
oncekit_store_errors_total{driver="redis",op="idem.begin"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(counters),
		"oncekit_idem_claims_total", "oncekit_lock_acquire_total", "oncekit_lock_lost_total",
		"oncekit_lock_release_total", "oncekit_store_errors_total"); err != nil {
		t.Error(err)
	}
	for _, h := range []struct {
		name   string
		labels map[string]string
		want   uint64
	}{
		{"oncekit_lock_wait_seconds", map[string]string{"driver": "memory"}, 2},
		{"oncekit_lock_hold_seconds", map[string]string{"driver": "memory"}, 2},
		{"oncekit_lock_handoff_seconds", map[string]string{"driver": "memory", "path": "local"}, 1},
	} {
		if got := histogramCount(t, reg, h.name, h.labels); got != h.want {
			t.Errorf("%s%v: %d samples, want %d", h.name, h.labels, got, h.want)
		}
	}
}

// The middleware events: requests by route and outcome, and the Kafka
// counters.
func TestMiddlewareMetrics(t *testing.T) {
	metrics := promobs.New(promobs.WithNamespace("shop"), promobs.WithConstLabels(prometheus.Labels{"service": "inventory"}))
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(metrics)
	for _, ev := range []observe.Event{
		{Op: "http.request", Request: &observe.Request{}, Route: "POST /orders", Outcome: observe.Executed, Duration: time.Millisecond},
		{Op: "http.request", Request: &observe.Request{}, Route: "POST /orders", Outcome: observe.Replayed, Duration: time.Millisecond},
		{Op: "kafka.message", Request: &observe.Request{Consumer: true}, Route: "payments", Outcome: observe.Duplicate},
		{Op: "kafka.message", Request: &observe.Request{Consumer: true}, Route: "payments", Outcome: observe.DeadLettered},
		{Op: "grpc.call", Request: &observe.Request{}, Route: "/shop.Orders/Place", Outcome: observe.Error, Driver: "redis"},
		{Op: "sqs.message", Request: &observe.Request{Consumer: true}, Route: "refunds", Outcome: observe.Executed}, // a transport oncekit does not ship
	} {
		metrics.End(t.Context(), ev)
	}
	const want = `
# HELP shop_kafka_dead_lettered_total Kafka messages sent to the dead-letter topic.
# TYPE shop_kafka_dead_lettered_total counter
shop_kafka_dead_lettered_total{route="payments",service="inventory"} 1
# HELP shop_kafka_duplicates_skipped_total Kafka messages skipped as already processed.
# TYPE shop_kafka_duplicates_skipped_total counter
shop_kafka_duplicates_skipped_total{route="payments",service="inventory"} 1
# HELP shop_middleware_requests_total Requests and messages through the middleware by outcome.
# TYPE shop_middleware_requests_total counter
shop_middleware_requests_total{op="grpc.call",outcome="error",route="/shop.Orders/Place",service="inventory"} 1
shop_middleware_requests_total{op="http.request",outcome="executed",route="POST /orders",service="inventory"} 1
shop_middleware_requests_total{op="http.request",outcome="replayed",route="POST /orders",service="inventory"} 1
shop_middleware_requests_total{op="kafka.message",outcome="dead_lettered",route="payments",service="inventory"} 1
shop_middleware_requests_total{op="kafka.message",outcome="duplicate",route="payments",service="inventory"} 1
shop_middleware_requests_total{op="sqs.message",outcome="executed",route="refunds",service="inventory"} 1
# HELP shop_store_errors_total Operations the store failed or could not be reached for.
# TYPE shop_store_errors_total counter
shop_store_errors_total{driver="redis",op="grpc.call",service="inventory"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "shop_kafka_dead_lettered_total",
		"shop_kafka_duplicates_skipped_total", "shop_middleware_requests_total", "shop_store_errors_total"); err != nil {
		t.Error(err)
	}
}

func histogramCount(t *testing.T, reg prometheus.Gatherer, name string, labels map[string]string) uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if matches(m, labels) {
				return m.GetHistogram().GetSampleCount()
			}
		}
	}
	return 0
}

func matches(m *dto.Metric, labels map[string]string) bool {
	n := 0
	for _, lp := range m.GetLabel() {
		if v, ok := labels[lp.GetName()]; ok {
			if v != lp.GetValue() {
				return false
			}
			n++
		}
	}
	return n == len(labels)
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5s")
		}
		time.Sleep(time.Millisecond)
	}
}

// The gauges read what the watched Guard, Mutex and Consumer hold at the
// scrape, and store operations' latency is a histogram per operation.
func TestGaugesAndStoreLatency(t *testing.T) {
	metrics := promobs.New()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(metrics)
	ctx := t.Context()
	store := memstore.New(memstore.WithObserver(metrics))
	g, err := idem.NewGuard(store)
	if err != nil {
		t.Fatal(err)
	}
	m, err := lock.NewMutex(store)
	if err != nil {
		t.Fatal(err)
	}
	metrics.WatchGuard("orders", g)
	metrics.WatchMutex("skus", m)
	metrics.WatchConsumer("shipping", uncommitted{"order.created": {0: 3, 1: 0}})

	gauge := func(name string, labels ...string) float64 { t.Helper(); return series(t, reg, name, labels...) }
	h, err := m.Lock(ctx, "sku-1")
	if err != nil {
		t.Fatal(err)
	}
	var during float64
	if _, _, err := g.Do(ctx, "order-1", "fp", func(context.Context) ([]byte, error) {
		during = gauge("oncekit_idem_claims_in_flight", "name", "orders")
		return nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	if after := gauge("oncekit_idem_claims_in_flight", "name", "orders"); during != 1 || after != 0 {
		t.Errorf("claims in flight during the run %v, after it %v; want 1 and 0", during, after)
	}
	if v := gauge("oncekit_lock_leases_held", "name", "skus"); v != 1 {
		t.Errorf("leases held %v, want 1", v)
	}
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if v := gauge("oncekit_lock_leases_held", "name", "skus"); v != 0 {
		t.Errorf("leases held after the release %v, want 0", v)
	}
	if v := gauge("oncekit_kafka_uncommitted_messages", "name", "shipping", "topic", "order.created", "partition", "0"); v != 3 {
		t.Errorf("uncommitted messages %v, want 3", v)
	}
	if n := testutil.CollectAndCount(metrics, "oncekit_store_duration_seconds"); n == 0 {
		t.Error("no store latency histogram")
	}
}

type uncommitted map[string]map[int]int64

func (u uncommitted) Uncommitted() map[string]map[int]int64 { return u }

// An effect that refuses (a sell-out) is a business answer, not a store
// failure: it counts as a refused claim, never in store_errors_total.
func TestRefusedEffectIsNotAStoreError(t *testing.T) {
	metrics := promobs.New()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(metrics)
	store := memstore.New(memstore.WithObserver(metrics))
	g, err := idem.NewGuard(store)
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = g.Do(t.Context(), "order-1", "fp", func(ctx context.Context) ([]byte, error) {
		return []byte("sold"), idem.Commit(ctx, memstore.Effect(func() error { return errors.New("sold_out") }))
	})
	if !errors.Is(err, idem.ErrEffectRefused) {
		t.Fatalf("Do = %v, want a refused effect", err)
	}
	if n := testutil.CollectAndCount(reg, "oncekit_store_errors_total"); n != 0 {
		t.Errorf("a refused effect is counted as %d store errors", n)
	}
	if got := series(t, reg, "oncekit_idem_claims_total", "outcome", "refused"); got != 1 {
		t.Errorf("refused claims = %v, want 1", got)
	}
}

// A sale's outcomes, the merge sizes of its store calls and the holds that
// ran out are metrics; a sell-out is no store error.
func TestStockMetrics(t *testing.T) {
	metrics := promobs.New()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(metrics)
	store := memstore.New(memstore.WithObserver(metrics))
	st, err := stock.New(store)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if _, err := st.Put(ctx, "phone", 1); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Take(ctx, "phone", "a", 1); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Take(ctx, "phone", "b", 1); !errors.Is(err, stock.ErrSoldOut) {
		t.Fatalf("second take: %v", err)
	}
	if _, err := st.Add(ctx, "phone", 1); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Hold(ctx, "phone", "h", 1, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond) // the hold's end is what is counted
	if _, err := st.Level(ctx, "phone"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		op, outcome string
		want        float64
	}{{"stock.take", "sold", 1}, {"stock.take", "sold_out", 1}, {"stock.hold", "held", 1}} {
		if got := series(t, reg, "oncekit_stock_operations_total", "op", c.op, "outcome", c.outcome); got != c.want {
			t.Errorf("%s %s = %v, want %v", c.op, c.outcome, got, c.want)
		}
	}
	if got := series(t, reg, "oncekit_stock_holds_expired_total"); got != 1 {
		t.Errorf("holds expired = %v, want 1", got)
	}
	if n := testutil.CollectAndCount(reg, "oncekit_store_errors_total"); n != 0 {
		t.Errorf("a sell-out is counted as %d store errors", n)
	}
	if n := testutil.CollectAndCount(reg, "oncekit_stock_merge_size"); n != 1 {
		t.Errorf("merge size series: %d, want 1", n)
	}
}

// series returns the value of the series of name with labels (name,
// value pairs): a gauge's or a counter's.
func series(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, mt := range mf.GetMetric() {
			for i := 0; i < len(labels); i += 2 {
				found := false
				for _, lp := range mt.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue next
				}
			}
			if mt.GetCounter() != nil {
				return mt.GetCounter().GetValue()
			}
			return mt.GetGauge().GetValue()
		}
	}
	t.Fatalf("no %s%v", name, labels)
	return 0
}
