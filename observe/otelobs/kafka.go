package otelobs

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"

	"github.com/oncekit/oncekit/kafkamw"
)

// KafkaPropagator returns a kafkamw.Propagator over p, or over
// OpenTelemetry's global propagator (read at each use, so one set later
// counts) when p is nil: with kafkamw.WithProducerPropagator the producer
// writes the caller's trace context into each message, and with
// kafkamw.WithPropagator the consumer's "process {topic}" span and the
// handler continue it.
func KafkaPropagator(p propagation.TextMapPropagator) kafkamw.Propagator {
	return kafkaPropagator{p}
}

type kafkaPropagator struct{ p propagation.TextMapPropagator }

func (k kafkaPropagator) get() propagation.TextMapPropagator {
	if k.p != nil {
		return k.p
	}
	return otel.GetTextMapPropagator()
}

func (k kafkaPropagator) Inject(ctx context.Context, c kafkamw.HeaderCarrier) { k.get().Inject(ctx, c) }

func (k kafkaPropagator) Extract(ctx context.Context, c kafkamw.HeaderCarrier) context.Context {
	return k.get().Extract(ctx, c)
}

func (k kafkaPropagator) Fields() []string { return k.get().Fields() }
