package kafkamw

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// DefaultKeyHeader is the message header that carries a message's
// idempotency key, as the Producer stamps it.
const DefaultKeyHeader = "message-id"

// Headers a dead-lettered message carries besides the original's own,
// each name after the Consumer's prefix (WithDeadLetterHeaders, default
// DefaultDeadLetterPrefix: "oncekit-dlt-original-topic" and so on), so
// that they never meet the application's headers.
const (
	HeaderOriginalTopic     = "original-topic"
	HeaderOriginalPartition = "original-partition"
	HeaderOriginalOffset    = "original-offset"
	HeaderIdempotencyKey    = "idempotency-key" // the stored key ("" for a message that has none)
	HeaderError             = "error"
	HeaderAttempts          = "attempts"       // handler calls made (0: rejected before any)
	HeaderConsumerGroup     = "consumer-group" // the group (WithGroup, or the Reader's)
	// HeaderRetryAt marks a message moved to a retry topic
	// (WithRetryTopic): when it may be handled again, in Unix milliseconds.
	HeaderRetryAt = "retry-at"
)

// DefaultDeadLetterPrefix prefixes the dead-letter headers' names.
const DefaultDeadLetterPrefix = "oncekit-dlt-"

// Option configures a Consumer.
type Option func(*config)

type config struct {
	keyHeader   string
	extract     func(Message) (string, bool)
	requireKey  bool
	scope       func(Message) string
	place       func(Message) string
	dlqPrefix   string
	retry       Writer
	retryTopic  string
	retryAfter  int
	retryDelay  time.Duration
	propagator  Propagator
	fingerprint func(Message) (string, error)
	group       string
	concurrency int
	pipeline    int
	attempts    int
	backoff     time.Duration
	maxBackoff  time.Duration
	dlq         Writer
	dlqTopic    string
	errs        []error
}

func defaults() config {
	return config{
		keyHeader:   DefaultKeyHeader,
		dlqPrefix:   DefaultDeadLetterPrefix,
		concurrency: 1,
		pipeline:    128,
		attempts:    5,
		backoff:     100 * time.Millisecond,
		maxBackoff:  10 * time.Second,
	}
}

func (c *config) check() error {
	if c.keyHeader == "" {
		c.errs = append(c.errs, errors.New("empty key header"))
	}
	if c.concurrency < 1 {
		c.errs = append(c.errs, fmt.Errorf("concurrency %d: want at least 1", c.concurrency))
	}
	if c.pipeline < 1 {
		c.errs = append(c.errs, fmt.Errorf("pipeline depth %d: want at least 1", c.pipeline))
	}
	if c.attempts < 1 {
		c.errs = append(c.errs, fmt.Errorf("%d attempts: want at least 1", c.attempts))
	}
	if c.backoff <= 0 || c.maxBackoff < c.backoff {
		c.errs = append(c.errs, fmt.Errorf("backoff %v up to %v: want 0 < backoff <= max", c.backoff, c.maxBackoff))
	}
	if err := errors.Join(c.errs...); err != nil {
		return fmt.Errorf("kafkamw: %w", err)
	}
	return nil
}

// WithKeyHeader sets the header that carries the idempotency key. Default
// "message-id".
func WithKeyHeader(name string) Option { return func(c *config) { c.keyHeader = name } }

// WithKeyExtractor takes the key from the message when its header has none:
// an ID field in the payload, say. extract reports false when the message
// carries no key.
func WithKeyExtractor(extract func(Message) (string, bool)) Option {
	return func(c *config) { c.extract = extract }
}

// WithRequireKey dead-letters a message that carries no key instead of
// keying it on its topic, partition and offset. The fallback deduplicates
// redeliveries of one record (a rebalance, a crash before the commit) but
// not a producer that sent the same logical message twice: require keys
// when producers retry.
func WithRequireKey() Option { return func(c *config) { c.requireKey = true } }

// WithPlacement places each message's record (idem.Placed) where the
// handler's effect lives: on Redis Cluster, in the slot of the hash tag
// {place}, so that an effect on keys tagged {place} commits in the script
// that completes the record (idem.Commit in the handler). Other stores keep a placed
// record as any other. "" leaves the message's record unplaced; a place
// over idemdriver.MaxPlaceLen bytes or with a brace is a bad key
// (lock.ErrInvalidKey: the message is handled as one without a valid key).
// The place is part of the stored key: keep it a function of the message.
func WithPlacement(place func(Message) string) Option {
	return func(c *config) {
		if place == nil {
			c.errs = append(c.errs, errors.New("nil placement function"))
		}
		c.place = place
	}
}

// WithFingerprint replaces what makes two messages with one key "the
// same message" (a redelivery is committed as a duplicate; another
// payload under the key is rejected: dead-lettered, or the Consumer stops
// with a PoisonError): to leave out a field a producer changes on every
// send (a timestamp), say, or to compare JSON values by idemdriver.CanonicalJSON.
// An error rejects the message the same way. Default DefaultFingerprint.
func WithFingerprint(fingerprint func(Message) (string, error)) Option {
	return func(c *config) {
		if fingerprint == nil {
			c.errs = append(c.errs, errors.New("nil fingerprint function"))
		}
		c.fingerprint = fingerprint
	}
}

// DefaultFingerprint is the topic, the Kafka record key and the value,
// byte for byte (not the headers, which brokers and tools may add to). A
// message moved to a retry topic (WithRetryTopic, under the default
// header prefix) has its original topic's fingerprint.
func DefaultFingerprint(msg Message) (string, error) {
	return fingerprint(msg, DefaultDeadLetterPrefix), nil
}

// WithScope sets the scope a message's key is stored under, so that keys
// from different sources never meet. Default: the consumer group and the
// topic, so that two services (two groups) each handle a message once, and a
// key reused on another topic is another message. A scope that omits the
// topic deduplicates one logical message published to several topics.
func WithScope(scope func(Message) string) Option {
	return func(c *config) { c.scope = scope }
}

// WithGroup names the consumer group, for the default scope, when the
// Reader does not say (KafkaGoReader and franz.Reader say: their group).
func WithGroup(id string) Option { return func(c *config) { c.group = id } }

// WithConcurrency runs up to n handlers at once. Messages of one partition
// are always handled in order, one at a time, so more than one helps only
// with several partitions. Default 1.
func WithConcurrency(n int) Option { return func(c *config) { c.concurrency = n } }

// WithPipeline sets how many fetched messages may be in flight at once
// (default 128): each is claimed in the store while earlier ones of its
// partition are still being handled, and completes while later ones are, so
// the store's round trips are off the critical path (and, over redisstore,
// many claims share one round trip). When that many are in flight, fetching
// waits. The price of depth: a consumer killed with that many claims in
// flight leaves them to run out their lease before the partition's next
// owner can take them.
func WithPipeline(depth int) Option { return func(c *config) { c.pipeline = depth } }

// WithRetry sets how often a failing handler is called for one message
// (attempts, default 5), and the backoff between calls: exponential from
// backoff (default 100 ms) to max (default 10 s), with jitter. After the
// last attempt the message is dead-lettered (WithDeadLetter).
func WithRetry(attempts int, backoff, max time.Duration) Option {
	return func(c *config) { c.attempts, c.backoff, c.maxBackoff = attempts, backoff, max }
}

// WithDeadLetter publishes a message whose handler failed every attempt (or
// returned a Permanent error), or that cannot be keyed, to w, with the
// original's key, value and headers plus original-topic,
// original-partition, original-offset, idempotency-key, error, attempts
// and consumer-group (each prefixed: WithDeadLetterHeaders); only then is
// it committed.
// topic is the dead-letter topic, or "" when w has its own (a kafka-go
// Writer with Topic set).
//
// Without a dead-letter destination such a message stops the Consumer: Run
// returns a *PoisonError and nothing after it in its partition is committed.
func WithDeadLetter(w Writer, topic string) Option {
	return func(c *config) {
		if w == nil {
			c.errs = append(c.errs, errors.New("nil dead-letter writer"))
		}
		c.dlq, c.dlqTopic = w, topic
	}
}

// WithRetryTopic keeps a failing message from blocking its partition
// while it backs off: after `after` failed handler calls in place, the
// message is published to w (topic, or w's own when "") with the
// dead-letter headers (WithDeadLetterHeaders: original coordinates,
// attempts so far, the error) and retry-at, the time it may be handled
// again (now + delay), and its offset is committed; the partition moves
// on.
//
// Consume the retry topic with a Consumer configured like this one — the
// same handler, Guard and options (it may be this very Consumer, reading
// both topics through the Reader's GroupTopics). It waits until a
// message's retry-at before handling it, counts attempts across topics
// (after WithRetry's attempts in all, the message is dead-lettered) and
// keeps its key space: the default scope and fingerprint of a moved
// message are those of its original topic and group, so the retry claims
// the original's key and a duplicate of the original is a duplicate. (A
// WithScope or WithFingerprint function of your own must do the same:
// read the original topic from the prefixed original-topic header of a
// message carrying retry-at.) A move is recorded under the message's
// coordinates: a redelivery of the original is not moved twice.
//
// A message without a key header (WithKeyHeader, WithKeyExtractor) is
// keyed by its coordinates, which a move changes: on the retry topic it is
// another key. Give messages keys (a Producer stamps them;
// WithRequireKey) where a retry topic is used.
func WithRetryTopic(w Writer, topic string, after int, delay time.Duration) Option {
	return func(c *config) {
		switch {
		case w == nil:
			c.errs = append(c.errs, errors.New("nil retry-topic writer"))
		case after < 1:
			c.errs = append(c.errs, fmt.Errorf("retry topic after %d attempts: want at least 1", after))
		case delay < 0:
			c.errs = append(c.errs, fmt.Errorf("retry-topic delay %s: want at least 0", delay))
		}
		c.retry, c.retryTopic, c.retryAfter, c.retryDelay = w, topic, after, delay
	}
}

// WithPropagator sets how a message's trace context is read from its
// headers, so that the message's span (otelobs) and the handler's context
// continue the producer's trace: otelobs.KafkaPropagator(nil) reads
// OpenTelemetry's global propagator. Default: none, the headers are not
// read for a trace.
func WithPropagator(p Propagator) Option {
	return func(c *config) { c.propagator = p }
}

// WithDeadLetterHeaders sets the prefix of the headers a dead-lettered
// message gets (HeaderOriginalTopic and the rest). Default
// DefaultDeadLetterPrefix; "" writes the bare names.
func WithDeadLetterHeaders(prefix string) Option {
	return func(c *config) { c.dlqPrefix = prefix }
}

// Writer is what a Producer and a dead-letter destination write through:
// KafkaGoWriter over kafka-go, franz.NewWriter over franz-go.
type Writer interface {
	WriteMessages(ctx context.Context, msgs ...Message) error
}
