package kafkamw

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/oncekit/oncekit/core/idem/idemdriver"
)

// Producer publishes messages through a Writer (KafkaGoWriter) with an
// idempotency key in each message's message-id header, minted once per
// logical message: the Writer's own retries resend the same bytes, and
// Producer's retries (WithSendRetries) and the caller's retries of the same
// messages slice keep the key, so a consumer running kafkamw handles the
// message once however often it was written.
type Producer struct {
	w          Writer
	header     string
	newKey     func() string
	attempts   int
	backoff    time.Duration
	maxBackoff time.Duration
	propagator Propagator
}

// ProducerOption configures a Producer.
type ProducerOption func(*Producer)

// WithProducerKeyHeader sets the header to stamp (default "message-id").
func WithProducerKeyHeader(name string) ProducerOption { return func(p *Producer) { p.header = name } }

// WithKeyGenerator sets how keys are minted (default idemdriver.NewKey: a
// version 7 UUID).
func WithKeyGenerator(newKey func() string) ProducerOption {
	return func(p *Producer) { p.newKey = newKey }
}

// WithSendRetries makes Send try a failed write up to attempts times in
// all (default 1: the Writer's own retries only), with jittered exponential
// backoff from backoff (default 100 ms) up to max (default 5 s).
func WithSendRetries(attempts int, backoff, max time.Duration) ProducerOption {
	return func(p *Producer) { p.attempts, p.backoff, p.maxBackoff = attempts, backoff, max }
}

// WithProducerPropagator sets how Send writes the caller's trace context
// into each message's headers, so that the consumer's span (otelobs,
// through kafkamw) continues the producer's trace:
// otelobs.KafkaPropagator(nil) writes OpenTelemetry's global propagator's.
// A message that already carries a trace context keeps it. Default: none.
func WithProducerPropagator(p Propagator) ProducerOption {
	return func(pr *Producer) { pr.propagator = p }
}

// NewProducer returns a Producer that writes through w.
func NewProducer(w Writer, opts ...ProducerOption) (*Producer, error) {
	p := &Producer{w: w, header: DefaultKeyHeader, newKey: idemdriver.NewKey, attempts: 1,
		backoff: 100 * time.Millisecond, maxBackoff: 5 * time.Second}
	for _, o := range opts {
		o(p)
	}
	var errs []error
	if w == nil {
		errs = append(errs, errors.New("nil Writer"))
	}
	if p.header == "" {
		errs = append(errs, errors.New("empty key header"))
	}
	if p.newKey == nil {
		errs = append(errs, errors.New("nil key generator"))
	}
	if p.attempts < 1 || p.backoff <= 0 || p.maxBackoff < p.backoff {
		errs = append(errs, fmt.Errorf("send retries %d, backoff %v up to %v: want attempts >= 1 and 0 < backoff <= max",
			p.attempts, p.backoff, p.maxBackoff))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("kafkamw: %w", err)
	}
	return p, nil
}

// Stamp gives msg a key in its header unless it has one, and returns the
// key. Stamp a message before the first Send of it when the application
// may send it again (from an outbox, say).
func (p *Producer) Stamp(msg *Message) string {
	for _, h := range msg.Headers {
		if h.Key == p.header {
			return string(h.Value)
		}
	}
	k := p.newKey()
	msg.Headers = append(msg.Headers, Header{Key: p.header, Value: []byte(k)})
	return k
}

// Send stamps every message that has no key (in place: a caller that
// passes the same slice again after an error sends the same keys) and
// writes them, retrying as WithSendRetries says. A key the application set
// itself is kept; it must be a valid idempotency key (1 to 255 bytes of
// printable ASCII).
func (p *Producer) Send(ctx context.Context, msgs ...Message) error {
	for i := range msgs {
		if err := idemdriver.CheckClientKey(p.Stamp(&msgs[i])); err != nil {
			return fmt.Errorf("kafkamw: message %d: %s header: %w", i, p.header, err)
		}
		inject(ctx, p.propagator, &msgs[i])
	}
	d := p.backoff
	for attempt := 1; ; attempt++ {
		err := p.w.WriteMessages(ctx, msgs...)
		if err == nil || attempt >= p.attempts || ctx.Err() != nil {
			return err
		}
		t := time.NewTimer(d/2 + rand.N(d/2+1))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return err
		}
		d = min(2*d, p.maxBackoff)
	}
}
