package kafkamw

import (
	"context"
)

// Propagator carries a trace context in a message's headers: the
// producer's Send writes the caller's, and the consumer continues it in
// the message's span and the handler's context. It has the method set of
// OpenTelemetry's propagation.TextMapPropagator over a HeaderCarrier;
// otelobs.KafkaPropagator adapts one (kafkamw itself does not depend on
// OpenTelemetry).
type Propagator interface {
	Inject(ctx context.Context, carrier HeaderCarrier)
	Extract(ctx context.Context, carrier HeaderCarrier) context.Context
	Fields() []string
}

// HeaderCarrier reads and writes a message's headers for a Propagator
// (and satisfies OpenTelemetry's propagation.TextMapCarrier): Set
// replaces a header of the name, Get reads the first.
type HeaderCarrier struct{ Msg *Message }

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
	c.Msg.Headers = append(hs, Header{Key: key, Value: []byte(value)})
}

// Keys returns the headers' names.
func (c HeaderCarrier) Keys() []string {
	keys := make([]string, len(c.Msg.Headers))
	for i, h := range c.Msg.Headers {
		keys[i] = h.Key
	}
	return keys
}

// extract is ctx with msg's trace context, when p is set.
func extract(ctx context.Context, p Propagator, msg *Message) context.Context {
	if p == nil {
		return ctx
	}
	return p.Extract(ctx, HeaderCarrier{msg})
}

// inject writes ctx's trace context into msg, unless msg already carries
// one (a message relayed from an outbox with the context of the request
// that wrote it keeps that one), or p is nil.
func inject(ctx context.Context, p Propagator, msg *Message) {
	if p == nil {
		return
	}
	c := HeaderCarrier{msg}
	for _, f := range p.Fields() {
		if c.Get(f) != "" {
			return
		}
	}
	p.Inject(ctx, c)
}
