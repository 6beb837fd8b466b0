package otelobs

import (
	"context"
	"errors"
	"fmt"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/oncekit/oncekit/core/observe"
)

// ScopeName is the instrumentation scope of the spans.
const ScopeName = "github.com/oncekit/oncekit"

// Attribute keys.
const (
	AttrDriver   = attribute.Key("oncekit.driver")
	AttrKeyHash  = attribute.Key("oncekit.key_hash")
	AttrOutcome  = attribute.Key("oncekit.outcome")
	AttrFence    = attribute.Key("oncekit.fence")
	AttrReplayed = attribute.Key("oncekit.replayed")
	AttrRoute    = attribute.Key("oncekit.route")
	AttrWait     = attribute.Key("oncekit.duration_ms")
)

// Option configures an Observer.
type Option func(*Observer)

// WithTracerProvider sets where spans go. Default: otel.GetTracerProvider()
// at New.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(o *Observer) { o.tracer = tp.Tracer(ScopeName) }
}

// Observer is an observe.Observer that makes OpenTelemetry spans.
//
// Every operation (lock.acquire, lock.refresh, lock.release, idem.begin,
// idem.complete, idem.abandon, http.request, grpc.call) is a span named
// after its Op, a child of the span in the caller's context, so the store
// operations nest under the middleware's span. Spans are INTERNAL, except
// a request's (http.request, grpc.call): SERVER when nothing traced the
// request before it in the process, INTERNAL under otelhttp's or
// otelgrpc's SERVER span. A Kafka message is a CONSUMER span named
// "process {topic}" with the messaging attributes (messaging.system,
// messaging.operation.type, messaging.destination.name, its partition,
// messaging.kafka.offset, messaging.consumer.group.name), the child of
// the producer's span when the message carries its context (kafkamw
// propagates it in headers with KafkaPropagator). Attributes:
// oncekit.driver, oncekit.key_hash (observe.HashKey, never the key),
// oncekit.route, and at the end oncekit.outcome, oncekit.fence and
// oncekit.replayed. An Error or Lost outcome sets the span's status to
// Error. Point events (lock.handoff, lock.lost, idem.lost) are span events
// on the span in their context.
type Observer struct {
	tracer trace.Tracer
}

// New returns an Observer.
func New(opts ...Option) *Observer {
	o := &Observer{}
	for _, opt := range opts {
		opt(o)
	}
	if o.tracer == nil {
		o.tracer = otel.GetTracerProvider().Tracer(ScopeName)
	}
	return o
}

type spanKey struct{}

// kind is the span kind of ev started under ctx. A request's span is
// SERVER only when nothing in this process traced the request before: under
// otelhttp's or otelgrpc's SERVER span (a local parent) it is INTERNAL, so
// a request has one SERVER span. A consumed message's span is CONSUMER (a
// "process" span, the producer's context as its parent when the message
// carried one).
func kind(ctx context.Context, ev observe.Event) trace.SpanKind {
	switch {
	case ev.Request == nil:
		return trace.SpanKindInternal
	case ev.Request.Consumer:
		return trace.SpanKindConsumer
	}
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() && !sc.IsRemote() {
		return trace.SpanKindInternal
	}
	return trace.SpanKindServer
}

// spanName is the span's name: the Op, or the name a middleware gives its
// unit ("process {topic}" for a Kafka message, as the messaging
// conventions name a consumer's processing).
func spanName(ev observe.Event) string {
	if ev.Request != nil && ev.Request.Name != "" {
		return ev.Request.Name
	}
	return string(ev.Op)
}

// requestAttrs are a middleware's attributes (observe.Request.Attrs) as
// span attributes.
func requestAttrs(r *observe.Request) []attribute.KeyValue {
	attrs := make([]attribute.KeyValue, 0, len(r.Attrs))
	for _, a := range r.Attrs {
		switch v := a.Value.(type) {
		case string:
			attrs = append(attrs, attribute.String(a.Key, v))
		case int64:
			attrs = append(attrs, attribute.Int64(a.Key, v))
		case int:
			attrs = append(attrs, attribute.Int(a.Key, v))
		default:
			attrs = append(attrs, attribute.String(a.Key, fmt.Sprint(v)))
		}
	}
	return attrs
}

// Start implements observe.Observer: it starts the operation's span.
func (o *Observer) Start(ctx context.Context, ev observe.Event) context.Context {
	attrs := make([]attribute.KeyValue, 0, 3)
	if ev.Driver != "" {
		attrs = append(attrs, AttrDriver.String(ev.Driver))
	}
	if ev.Key != "" {
		attrs = append(attrs, AttrKeyHash.String(observe.HashKey(ev.Key)))
	}
	if ev.Route != "" {
		attrs = append(attrs, AttrRoute.String(ev.Route))
	}
	if ev.Request != nil {
		attrs = append(attrs, requestAttrs(ev.Request)...)
	}
	ctx, span := o.tracer.Start(ctx, spanName(ev), trace.WithSpanKind(kind(ctx, ev)), trace.WithAttributes(attrs...))
	return context.WithValue(ctx, spanKey{}, span)
}

// End implements observe.Observer: it ends the span Start began.
func (o *Observer) End(ctx context.Context, ev observe.Event) {
	span, ok := ctx.Value(spanKey{}).(trace.Span)
	if !ok {
		return // not started by this Observer
	}
	span.SetAttributes(endAttrs(ev)...)
	if ev.Route != "" {
		span.SetAttributes(AttrRoute.String(ev.Route))
	}
	if ev.Outcome == observe.Error || ev.Outcome == observe.Lost {
		if ev.Err != nil { // the key hashed, as in the span's attributes
			span.RecordError(errors.New(observe.RedactKey(ev.Err, ev.Key)))
		}
		span.SetStatus(codes.Error, string(ev.Outcome))
	}
	span.End()
}

func endAttrs(ev observe.Event) []attribute.KeyValue {
	attrs := []attribute.KeyValue{
		AttrOutcome.String(string(ev.Outcome)),
		AttrReplayed.Bool(ev.Outcome == observe.Replayed),
	}
	if ev.Fence != 0 {
		attrs = append(attrs, AttrFence.Int64(int64(ev.Fence)))
	}
	return attrs
}

// Record implements observe.Observer: a span event on ctx's span.
func (o *Observer) Record(ctx context.Context, ev observe.Event) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	attrs := endAttrs(ev)
	if ev.Key != "" {
		attrs = append(attrs, AttrKeyHash.String(observe.HashKey(ev.Key)))
	}
	if ev.Duration != 0 {
		attrs = append(attrs, AttrWait.Float64(float64(ev.Duration.Microseconds())/1000))
	}
	span.AddEvent(string(ev.Op), trace.WithAttributes(attrs...))
}

var _ observe.Observer = (*Observer)(nil)
