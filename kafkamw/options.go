package kafkamw

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
)

// DefaultKeyHeader is the message header that carries a message's
// idempotency key, as the Producer stamps it.
const DefaultKeyHeader = "message-id"

// Headers of a dead-lettered message, besides the original's own headers.
const (
	HeaderOriginalTopic     = "original-topic"
	HeaderOriginalPartition = "original-partition"
	HeaderOriginalOffset    = "original-offset"
	HeaderIdempotencyKey    = "idempotency-key"
	HeaderError             = "error"
)

// Option configures a Consumer.
type Option func(*config)

type config struct {
	keyHeader   string
	extract     func(kafka.Message) (string, bool)
	requireKey  bool
	scope       func(kafka.Message) string
	place       func(kafka.Message) string
	fingerprint func(kafka.Message) (string, error)
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
		fingerprint: DefaultFingerprint,
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
func WithKeyExtractor(extract func(kafka.Message) (string, bool)) Option {
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
// that completes the record (kafkamw.Commit). Other stores keep a placed
// record as any other. "" leaves the message's record unplaced; a place
// over idem.MaxPlaceLen bytes or with a brace is a bad key
// (idem.ErrInvalidKey: the message is handled as one without a valid key).
// The place is part of the stored key: keep it a function of the message.
func WithPlacement(place func(kafka.Message) string) Option {
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
// send (a timestamp), say, or to compare JSON values by idem.CanonicalJSON.
// An error rejects the message the same way. Default DefaultFingerprint.
func WithFingerprint(fingerprint func(kafka.Message) (string, error)) Option {
	return func(c *config) {
		if fingerprint == nil {
			c.errs = append(c.errs, errors.New("nil fingerprint function"))
		}
		c.fingerprint = fingerprint
	}
}

// DefaultFingerprint is the topic, the Kafka record key and the value,
// byte for byte (not the headers, which brokers and tools may add to).
func DefaultFingerprint(msg kafka.Message) (string, error) { return fingerprint(msg), nil }

// WithScope sets the scope a message's key is stored under, so that keys
// from different sources never meet. Default: the consumer group and the
// topic, so that two services (two groups) each handle a message once, and a
// key reused on another topic is another message. A scope that omits the
// topic deduplicates one logical message published to several topics.
func WithScope(scope func(kafka.Message) string) Option {
	return func(c *config) { c.scope = scope }
}

// WithGroup names the consumer group, for the default scope, when the
// Reader does not say (a *kafka.Reader says: its GroupID).
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
// original's headers plus original-topic, original-partition,
// original-offset, idempotency-key and error; only then is it committed.
// topic is the dead-letter topic, or "" when w has its own (a kafka.Writer
// with Topic set).
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

// Writer is what a Producer and a dead-letter destination write through: a
// *kafka.Writer.
type Writer interface {
	WriteMessages(ctx context.Context, msgs ...kafka.Message) error
}
