package inventory

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/kafkamw"
	"github.com/oncekit/oncekit/lead"
	"github.com/oncekit/oncekit/observe/otelobs"
)

// traceOf is the trace context in ctx, as the global propagator writes it
// (nil when there is none).
func traceOf(ctx context.Context) map[string]string {
	c := propagation.MapCarrier{}
	otel.GetTextMapPropagator().Inject(ctx, c)
	if len(c) == 0 {
		return nil
	}
	return c
}

// TopicOrderCreated is where sales are announced.
const TopicOrderCreated = "order.created"

// RelayOutbox publishes order.created for every sale in the backend's
// outbox through p, then removes it, until ctx ends. A sale writes its
// event into the outbox in the same commit as the sale itself, so no sale
// goes unannounced even when its replica dies right after; the event's
// message-id is the order's ID, so an entry relayed again after a crash
// (published, the replica dead before it removed it) is shipped once by a
// kafkamw consumer.
//
// Every replica calls it; one relays at a time (lead.Run on key, which
// names the outbox: replicas of one inventory pass the same key): a
// leader that dies is replaced within the lock's TTL, and a leader that
// loses its lock stops relaying before another can start.
func (s *Service) RelayOutbox(ctx context.Context, p *kafkamw.Producer, key string, every time.Duration) error {
	return lead.Run(ctx, s.store, key, func(ctx context.Context, _ lock.Lease) error {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			_ = s.relayOnce(ctx, p) // the broker or the store is away: the next tick tries again
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
			case <-s.kick:
			}
		}
	}, lead.WithTTL(s.relayTTL), lead.WithRetryDelay(every))
}

func (s *Service) relayOnce(ctx context.Context, p *kafkamw.Producer) error {
	for {
		orders, err := s.backend.Outbox(ctx, 100)
		if err != nil || len(orders) == 0 {
			return err
		}
		msgs := make([]kafkamw.Message, len(orders))
		for i, o := range orders {
			trace := o.Trace
			o.Trace = nil // carried in the headers
			body, _ := json.Marshal(o)
			msgs[i] = kafkamw.Message{Key: []byte(o.SKU), Value: body,
				Headers: []kafkamw.Header{{Key: kafkamw.DefaultKeyHeader, Value: []byte(o.OrderID)}}}
			// The message continues the trace of the request that sold
			// the order, not the relay's.
			otel.GetTextMapPropagator().Inject(
				otel.GetTextMapPropagator().Extract(context.Background(), propagation.MapCarrier(trace)),
				kafkamw.HeaderCarrier{Msg: &msgs[i]})
		}
		if err := p.Send(ctx, msgs...); err != nil {
			return err
		}
		if err := s.backend.Published(ctx, orders); err != nil {
			return err
		}
		s.relayed.Add(int64(len(orders)))
	}
}

// ShippingConsumer returns the consumer that ships each order once: its
// shipment is recorded with the message's idempotency record (or keyed on
// the order, with Redlock). Run it on every replica, in one group.
func (s *Service) ShippingConsumer(r kafkamw.Reader, opts ...kafkamw.Option) (*kafkamw.Consumer, error) {
	c, err := kafkamw.NewConsumer(r, s.guard, func(ctx context.Context, m kafkamw.Message) error {
		var o Order
		if err := json.Unmarshal(m.Value, &o); err != nil || o.OrderID == "" {
			return kafkamw.Permanent(errors.Join(errors.New("inventory: order.created is not an order"), err))
		}
		effect, err := s.backend.Ship(ctx, o)
		if err != nil || effect == nil {
			return err
		}
		return idem.Commit(ctx, effect)
	}, append([]kafkamw.Option{
		// The shipment's record lives with the SKU's shipments (the
		// message's key is the SKU): on Redis Cluster, in its slot.
		kafkamw.WithPlacement(func(m kafkamw.Message) string { return placeOf(string(m.Key)) }),
		// The handler continues the trace of the request that sold it.
		kafkamw.WithPropagator(otelobs.KafkaPropagator(nil)),
	}, opts...)...)
	if err == nil {
		s.consumers.Store(c, struct{}{}) // its Stats show in /v1/stats
	}
	return c, err
}
