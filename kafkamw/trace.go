package kafkamw

import (
	"context"

	"github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
)

// HeaderCarrier lets an OpenTelemetry propagator read and write a
// message's headers (propagation.TextMapCarrier): Set replaces a header of
// the name, Get reads the first.
type HeaderCarrier struct{ Msg *kafka.Message }

// Get returns the value of the first header named key, or "".
func (c HeaderCarrier) Get(key string) string {
	for _, h := range c.Msg.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// Set replaces the headers named key with one holding value.
func (c HeaderCarrier) Set(key, value string) {
	hs := c.Msg.Headers[:0:0]
	for _, h := range c.Msg.Headers {
		if h.Key != key {
			hs = append(hs, h)
		}
	}
	c.Msg.Headers = append(hs, kafka.Header{Key: key, Value: []byte(value)})
}

// Keys returns the headers' names.
func (c HeaderCarrier) Keys() []string {
	keys := make([]string, len(c.Msg.Headers))
	for i, h := range c.Msg.Headers {
		keys[i] = h.Key
	}
	return keys
}

var _ propagation.TextMapCarrier = HeaderCarrier{}

// propagatorOr is p, or the global propagator (otel.GetTextMapPropagator,
// a no-op until the application sets one) read now.
func propagatorOr(p propagation.TextMapPropagator) propagation.TextMapPropagator {
	if p != nil {
		return p
	}
	return otel.GetTextMapPropagator()
}

// inject writes ctx's trace context into msg, unless msg already carries
// one (a message relayed from an outbox with the context of the request
// that wrote it keeps that one).
func inject(ctx context.Context, p propagation.TextMapPropagator, msg *kafka.Message) {
	c := HeaderCarrier{msg}
	for _, f := range p.Fields() {
		if c.Get(f) != "" {
			return
		}
	}
	p.Inject(ctx, c)
}
