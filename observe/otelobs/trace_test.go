package otelobs_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/httpmw"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/kafkamw"
	"github.com/oncekit/oncekit/observe/otelobs"
	"github.com/oncekit/oncekit/storage/memstore"
)

func spansNamed(rec *tracetest.SpanRecorder, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// A request's span is SERVER on its own, INTERNAL under a SERVER span of
// this process (otelhttp's), and SERVER again under a remote parent (a
// traceparent header extracted by the application).
func TestRequestSpanKinds(t *testing.T) {
	rec, tp, tracing := setup(t)
	g, err := idem.NewGuard(memstore.New(memstore.WithObserver(tracing)))
	if err != nil {
		t.Fatal(err)
	}
	mw, err := httpmw.New(g, httpmw.Unscoped())
	if err != nil {
		t.Fatal(err)
	}
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(201) }))
	send := func(ctx context.Context, key string) {
		req := httptest.NewRequest("POST", "/orders", nil).WithContext(ctx)
		req.Header.Set("Idempotency-Key", key)
		h.ServeHTTP(httptest.NewRecorder(), req)
	}
	send(context.Background(), "k1")
	local, server := tp.Tracer("otelhttp").Start(context.Background(), "POST /orders", trace.WithSpanKind(trace.SpanKindServer))
	send(local, "k2")
	server.End()
	remote := trace.ContextWithRemoteSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}, TraceFlags: trace.FlagsSampled, Remote: true}))
	send(remote, "k3")

	got := spansNamed(rec, "http.request")
	if len(got) != 3 {
		t.Fatalf("%d http.request spans, want 3", len(got))
	}
	for i, want := range []trace.SpanKind{trace.SpanKindServer, trace.SpanKindInternal, trace.SpanKindServer} {
		if got[i].SpanKind() != want {
			t.Errorf("request %d: span kind %v, want %v", i+1, got[i].SpanKind(), want)
		}
	}
}

// One trace from an HTTP request through Kafka: the handler sends a
// message through kafkamw's Producer, whose headers carry the request's
// trace context; the consumer's "process {topic}" span (CONSUMER, with
// the messaging attributes) continues that trace, and the handler's
// context carries it.
func TestTraceThroughKafka(t *testing.T) {
	rec, tp, tracing := setup(t)
	brokers := testenv.KafkaBrokers(t)
	topic := testenv.KafkaTopic(t, brokers, 1)
	prop := propagation.TraceContext{}

	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, BatchTimeout: time.Millisecond}
	t.Cleanup(func() { w.Close() })
	producer, err := kafkamw.NewProducer(kafkamw.KafkaGoWriter(w), kafkamw.WithProducerPropagator(otelobs.KafkaPropagator(prop)))
	if err != nil {
		t.Fatal(err)
	}
	g, err := idem.NewGuard(memstore.New(memstore.WithObserver(tracing)))
	if err != nil {
		t.Fatal(err)
	}
	mw, err := httpmw.New(g, httpmw.Unscoped())
	if err != nil {
		t.Fatal(err)
	}
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := producer.Send(r.Context(), kafkamw.Message{Key: []byte("sku-1"), Value: []byte(`{"order":"o-1"}`)}); err != nil {
			t.Error(err)
		}
		w.WriteHeader(201)
	}))
	ctx, root := tp.Tracer("test").Start(t.Context(), "client")
	req := httptest.NewRequest("POST", "/orders", strings.NewReader("{}")).WithContext(ctx)
	req.Header.Set("Idempotency-Key", "order-1")
	h.ServeHTTP(httptest.NewRecorder(), req)
	root.End()

	r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, GroupID: "g-" + topic, MaxWait: 100 * time.Millisecond})
	t.Cleanup(func() { r.Close() })
	handled := make(chan trace.SpanContext, 1)
	c, err := kafkamw.NewConsumer(kafkamw.KafkaGoReader(r), g, func(ctx context.Context, m kafkamw.Message) error {
		handled <- trace.SpanContextFromContext(ctx)
		return nil
	}, kafkamw.WithPropagator(otelobs.KafkaPropagator(prop)))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	var inHandler trace.SpanContext
	select {
	case inHandler = <-handled:
	case <-time.After(time.Minute):
		t.Fatal("the message was not handled within a minute")
	}
	cancel()
	<-done

	traceID := root.SpanContext().TraceID()
	if inHandler.TraceID() != traceID {
		t.Errorf("the handler's context is in trace %s, want the request's %s", inHandler.TraceID(), traceID)
	}
	var process []sdktrace.ReadOnlySpan
	for deadline := time.Now().Add(10 * time.Second); len(process) == 0 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		process = spansNamed(rec, "process "+topic)
	}
	if len(process) != 1 {
		t.Fatalf("%d process spans, want 1", len(process))
	}
	p := process[0]
	a := attrs(p)
	if p.SpanKind() != trace.SpanKindConsumer || p.SpanContext().TraceID() != traceID || !p.Parent().IsRemote() ||
		a[kafkamw.AttrMessagingSystem].AsString() != "kafka" || a[kafkamw.AttrMessagingOperation].AsString() != "process" ||
		a[kafkamw.AttrMessagingDest].AsString() != topic || a[kafkamw.AttrMessagingPartition].AsString() != "0" ||
		a[kafkamw.AttrMessagingGroup].AsString() != "g-"+topic {
		t.Errorf("process span: kind %v, trace %s (want %s), parent %v, attributes %v",
			p.SpanKind(), p.SpanContext().TraceID(), traceID, p.Parent(), a)
	}
	if reqs := spansNamed(rec, "http.request"); len(reqs) != 1 || reqs[0].SpanContext().TraceID() != traceID {
		t.Errorf("http.request spans %v, want one in the request's trace", reqs)
	}
}
