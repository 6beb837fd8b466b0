package otelobs_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/observe"
	"github.com/oncekit/oncekit/observe/otelobs"
	"github.com/oncekit/oncekit/storage/memstore"
)

func setup(t *testing.T) (*tracetest.SpanRecorder, *sdktrace.TracerProvider, *otelobs.Observer) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return rec, tp, otelobs.New(otelobs.WithTracerProvider(tp))
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// Guard operations are spans under the caller's span, with the outcome,
// the fence and the replay flag; the key appears only hashed.
func TestGuardSpans(t *testing.T) {
	rec, tp, tracing := setup(t)
	store := memstore.New(memstore.WithObserver(tracing))
	g, err := idem.NewGuard(store)
	if err != nil {
		t.Fatal(err)
	}
	ctx, parent := tp.Tracer("test").Start(t.Context(), "POST /orders")
	run := func(context.Context) ([]byte, error) { return []byte("ok"), nil }
	if _, _, err := g.Do(ctx, "order-1", "fp", run); err != nil {
		t.Fatal(err)
	}
	if _, replayed, err := g.Do(ctx, "order-1", "fp", run); err != nil || !replayed {
		t.Fatalf("duplicate: %v %v", replayed, err)
	}
	parent.End()

	var got []string
	for _, s := range rec.Ended() {
		got = append(got, s.Name())
	}
	want := []string{"idem.begin", "idem.complete", "idem.begin", "POST /orders"}
	if len(got) != len(want) {
		t.Fatalf("spans %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("spans %v, want %v", got, want)
		}
	}
	spans := rec.Ended()
	first, complete, replay := attrs(spans[0]), attrs(spans[1]), attrs(spans[2])
	if first[otelobs.AttrOutcome].AsString() != "acquired" || first[otelobs.AttrFence].AsInt64() <= 0 ||
		first[otelobs.AttrReplayed].AsBool() || first[otelobs.AttrDriver].AsString() != "memory" {
		t.Errorf("first begin: %v", first)
	}
	if complete[otelobs.AttrOutcome].AsString() != "stored" {
		t.Errorf("complete: %v", complete)
	}
	if replay[otelobs.AttrOutcome].AsString() != "replayed" || !replay[otelobs.AttrReplayed].AsBool() {
		t.Errorf("replay: %v", replay)
	}
	if h := first[otelobs.AttrKeyHash].AsString(); h != observe.HashKey("order-1") {
		t.Errorf("key hash %q, want %q", h, observe.HashKey("order-1"))
	}
	for _, s := range spans[:3] {
		if s.Parent().SpanID() != parent.SpanContext().SpanID() {
			t.Errorf("%s is not a child of the caller's span", s.Name())
		}
		for _, kv := range s.Attributes() {
			if kv.Value.AsString() == "order-1" {
				t.Errorf("%s carries the raw key in %s", s.Name(), kv.Key)
			}
		}
	}
}

// A lock hand-off is an event on the waiter's acquire span, and a lost
// lease marks its release span as an error.
func TestLockSpans(t *testing.T) {
	rec, _, tracing := setup(t)
	store := memstore.New(memstore.WithObserver(tracing))
	m, err := lock.NewMutex(store, lock.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	first, err := m.Lock(ctx, "sku")
	if err != nil {
		t.Fatal(err)
	}
	next := make(chan lock.Held)
	go func() {
		h, err := m.Lock(ctx, "sku")
		if err != nil {
			t.Error(err)
		}
		next <- h
	}()
	for info, _ := store.InspectLock(ctx, "sku"); info.Waiters == 0; info, _ = store.InspectLock(ctx, "sku") {
		time.Sleep(time.Millisecond)
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	second := <-next
	if _, err := store.ForceRelease(ctx, "sku"); err != nil {
		t.Fatal(err)
	}
	<-second.Lost()
	_ = second.Release(ctx)

	var acquires, releases []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		switch s.Name() {
		case "lock.acquire":
			acquires = append(acquires, s)
		case "lock.release":
			releases = append(releases, s)
		}
	}
	if len(acquires) != 2 || len(releases) != 2 {
		t.Fatalf("%d acquire and %d release spans, want 2 and 2", len(acquires), len(releases))
	}
	waited := acquires[1]
	if len(waited.Events()) != 1 || waited.Events()[0].Name != "lock.handoff" {
		t.Errorf("waiter's acquire span events: %v, want one lock.handoff", waited.Events())
	}
	if f := attrs(waited)[otelobs.AttrFence].AsInt64(); f <= attrs(acquires[0])[otelobs.AttrFence].AsInt64() {
		t.Errorf("fences not increasing: %d", f)
	}
	if releases[0].Status().Code == codes.Error || releases[1].Status().Code != codes.Error {
		t.Errorf("release statuses %v, %v; want ok, then error (lost)", releases[0].Status(), releases[1].Status())
	}
}

// An effect that refuses (a sell-out) is a business answer: its complete
// span says refused and is not an error.
func TestRefusedEffectSpanIsNotAnError(t *testing.T) {
	rec, _, tracing := setup(t)
	store := memstore.New(memstore.WithObserver(tracing))
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
	for _, s := range rec.Ended() {
		if s.Name() != "idem.complete" {
			continue
		}
		if got := attrs(s)[otelobs.AttrOutcome].AsString(); got != "refused" {
			t.Errorf("complete span outcome %q, want refused", got)
		}
		if s.Status().Code == codes.Error {
			t.Errorf("a refused effect's span is an error: %v", s.Status())
		}
	}
}
