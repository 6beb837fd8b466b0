package kafkamw

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/observe"
	"github.com/oncekit/oncekit/internal/mwcore"
)

// ErrNoKey is the error of a message with no key when keys are required
// (WithRequireKey).
var ErrNoKey = errors.New("kafkamw: message has no idempotency key")

// PoisonError stops a Consumer that has no dead-letter destination: a
// message failed every attempt or cannot be keyed. Nothing at or after its
// offset in its partition was committed.
type PoisonError struct {
	Topic     string
	Partition int
	Offset    int64
	Err       error
}

func (e *PoisonError) Error() string {
	return fmt.Sprintf("kafkamw: %s/%d@%d cannot be handled and there is no dead-letter destination: %v",
		e.Topic, e.Partition, e.Offset, e.Err)
}

func (e *PoisonError) Unwrap() error { return e.Err }

// Permanent marks a handler error as one that no retry will fix (a message
// that does not parse, say): the message is dead-lettered at once.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err}
}

type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// IsPermanent reports whether err was marked Permanent.
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}

// keyOf returns msg's stored (scoped) key.
func (c *Consumer) keyOf(msg Message) (idemdriver.Key, error) {
	raw, found := header(msg, c.cfg.keyHeader)
	if found && raw == "" {
		return idemdriver.Key{}, fmt.Errorf("kafkamw: empty %s header: %w", c.cfg.keyHeader, lock.ErrInvalidKey)
	}
	if !found && c.cfg.extract != nil {
		raw, found = c.cfg.extract(msg)
	}
	if found {
		if err := idemdriver.CheckClientKey(raw); err != nil {
			return idemdriver.Key{}, fmt.Errorf("kafkamw: %s: %w", c.cfg.keyHeader, err)
		}
	} else {
		if c.cfg.requireKey {
			return idemdriver.Key{}, ErrNoKey
		}
		raw = "offset\x00" + msg.Topic + "\x00" + strconv.Itoa(msg.Partition) + "\x00" + strconv.FormatInt(msg.Offset, 10)
	}
	place := ""
	if c.cfg.place != nil {
		place = c.cfg.place(msg)
	}
	stored, err := idemdriver.StoredKey(c.cfg.scope(msg), "", raw, place)
	if err != nil {
		return idemdriver.Key{}, fmt.Errorf("kafkamw: %w: %w", lock.ErrInvalidKey, err)
	}
	return stored, nil
}

func header(msg Message, name string) (string, bool) {
	for _, h := range msg.Headers {
		if h.Key == name {
			return string(h.Value), true
		}
	}
	return "", false
}

// process takes msg to done: handled here (observe.Executed), found done
// before (Duplicate), or dead-lettered (DeadLettered). Else it stopped
// first — the Consumer is stopping (Canceled) or failed (Error) — and msg
// is not committed.
func (c *Consumer) process(ctx context.Context, msg Message, key idemdriver.Key, keyErr error, prev, keyPrev <-chan struct{}, pass func()) observe.Outcome {
	if keyErr != nil {
		return c.reject(ctx, msg, idemdriver.Key{}, keyErr, prev)
	}
	if keyPrev != nil {
		select {
		case <-keyPrev:
		case <-ctx.Done():
			return observe.Canceled
		}
	}
	fp, err := c.fingerprint(msg)
	if err != nil {
		return c.reject(ctx, msg, key, fmt.Errorf("kafkamw: the message's fingerprint: %w", err), prev)
	}
	prior, err := c.retried(ctx, msg)
	if err != nil {
		return observe.Canceled
	}
	attempt, waits := 0, 0
	move := false
	for {
		var herr error
		res, replayed, err := c.guard.Do(idemdriver.AnswersOnReturn(ctx), key.String(), fp, func(ctx context.Context) ([]byte, error) {
			if err := c.turn(ctx, prev); err != nil {
				return nil, err
			}
			defer func() { <-c.workers }()
			attempt++
			if herr = c.call(ctx, msg); herr == nil {
				pass()
				return resultHandled, nil
			}
			final := prior+attempt >= c.cfg.attempts || IsPermanent(herr)
			if !final && c.cfg.retry != nil && attempt >= c.cfg.retryAfter {
				move = true // to the retry topic, once the claim is given back
				return nil, herr
			}
			if c.cfg.dlq == nil || !final {
				return nil, herr
			}
			// Dead-lettered under the claim, then recorded: a redelivery
			// finds it done and is not dead-lettered again.
			if err := c.deadLetter(ctx, msg, key, herr, prior+attempt); err != nil {
				return nil, err
			}
			pass()
			return resultDeadLettered, nil
		})
		if ctx.Err() != nil {
			return observe.Canceled
		}
		switch {
		case err == nil:
			return c.count(res, replayed)
		case replayed: // a final error stored by the Guard (WithFinalErrors); never the handler's own
			return c.count(nil, true)
		case herr != nil && move:
			return c.moveToRetry(ctx, msg, key, herr, prior+attempt)
		case herr != nil:
			if prior+attempt >= c.cfg.attempts || IsPermanent(herr) { // and no dead-letter destination
				c.fail(&PoisonError{Topic: msg.Topic, Partition: msg.Partition, Offset: msg.Offset, Err: herr})
				return observe.Error
			}
			c.add(&c.stats.Retries)
			if !c.sleep(ctx, attempt) {
				return observe.Canceled
			}
			continue
		}
		// Kafka has no client to answer: a key that cannot be claimed is
		// dead-lettered, one in flight waited for, and a store that does
		// not answer retried (there is no failing open).
		var core mwcore.Config
		switch refusal, _ := core.Refused(ctx, err); refusal {
		case mwcore.Mismatch, mwcore.InvalidKey, mwcore.CorruptRecord:
			return c.reject(ctx, msg, key, err, prev)
		case mwcore.InFlight:
			// Another member (the old owner after a rebalance) is
			// handling it: wait for its outcome.
			waits++
			if !c.sleep(ctx, min(waits, 4)) {
				return observe.Canceled
			}
		default:
			// The store did not answer, or the claim was lost: nothing is
			// committed until it does; the partition waits.
			c.add(&c.stats.StoreErrors)
			waits++
			if !c.sleep(ctx, waits) {
				return observe.Canceled
			}
		}
	}
}

// turn waits until every earlier message of the partition has had its turn
// and a handler slot is free.
func (c *Consumer) turn(ctx context.Context, prev <-chan struct{}) error {
	select {
	case <-prev:
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	select {
	case c.workers <- struct{}{}:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// call runs the handler; a panic is its error.
func (c *Consumer) call(ctx context.Context, msg Message) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("kafkamw: handler panicked: %v", p)
		}
	}()
	return c.handler(ctx, msg)
}

// reject dead-letters a message that cannot be claimed (no key, a bad key,
// a key reused with another payload), in its turn, or stops the Consumer
// when there is no dead-letter destination. The rejection is recorded
// under the message's coordinates (it has no key of its own to record it
// under): a redelivery of the same message finds it and is committed as a
// duplicate, not dead-lettered again.
func (c *Consumer) reject(ctx context.Context, msg Message, key idemdriver.Key, cause error, prev <-chan struct{}) observe.Outcome {
	if c.cfg.dlq == nil {
		c.fail(&PoisonError{Topic: msg.Topic, Partition: msg.Partition, Offset: msg.Offset, Err: cause})
		return observe.Error
	}
	return c.onceAt(ctx, msg, "rejected", func(ctx context.Context) ([]byte, error) {
		select {
		case <-prev:
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
		if err := c.deadLetter(ctx, msg, key, cause, c.priorAttempts(msg)); err != nil {
			return nil, err
		}
		return resultDeadLettered, nil
	})
}

// onceAt runs write once for msg's coordinates — a rejection or a move has
// no key of its own to be recorded under — and counts the outcome: a
// redelivery of msg finds it done. While another member runs it (the old
// owner after a rebalance) or the store does not answer, the partition
// waits.
func (c *Consumer) onceAt(ctx context.Context, msg Message, what string, write func(ctx context.Context) ([]byte, error)) observe.Outcome {
	rkey := idemdriver.ScopedKey(c.cfg.scope(msg), what+"\x00"+msg.Topic+"\x00"+strconv.Itoa(msg.Partition)+"\x00"+strconv.FormatInt(msg.Offset, 10))
	for waits := 1; ; waits++ {
		res, replayed, err := c.guard.Do(ctx, rkey, fingerprint(msg, c.cfg.dlqPrefix), write)
		switch {
		case ctx.Err() != nil:
			return observe.Canceled
		case err == nil:
			return c.count(res, replayed)
		case !errors.Is(err, idem.ErrInFlight):
			c.add(&c.stats.StoreErrors)
		}
		if !c.sleep(ctx, min(waits, 4)) {
			return observe.Canceled
		}
	}
}

// write writes m through w, retrying with backoff until it is written or
// ctx ends, and counts it in n.
func (c *Consumer) write(ctx context.Context, w Writer, m Message, n *int64) error {
	for attempt := 1; ; attempt++ {
		err := w.WriteMessages(ctx, m)
		if err == nil {
			c.add(n)
			return nil
		}
		if !c.sleep(ctx, attempt) {
			return err
		}
	}
}

// fingerprint is what makes two messages with one key the same message:
// the topic (the original's, for a message moved to a retry topic), the
// Kafka record key and the value (not the headers, which brokers and tools
// may add to).
func fingerprint(msg Message, prefix string) string {
	topic, _ := origin(msg, prefix)
	return idem.Fingerprint([]byte(topic), msg.Key, msg.Value)
}

// fingerprint is msg's fingerprint: WithFingerprint's, or the default
// under the Consumer's header prefix.
func (c *Consumer) fingerprint(msg Message) (string, error) {
	if c.cfg.fingerprint != nil {
		return c.cfg.fingerprint(msg)
	}
	return fingerprint(msg, c.cfg.dlqPrefix), nil
}

// origin returns the topic and group a message was first consumed from:
// the headers of one moved to a retry topic (it carries retry-at), or its
// own topic and group "".
func origin(msg Message, prefix string) (topic, group string) {
	if _, moved := header(msg, prefix+HeaderRetryAt); !moved {
		return msg.Topic, ""
	}
	topic, ok := header(msg, prefix+HeaderOriginalTopic)
	if !ok || topic == "" {
		topic = msg.Topic
	}
	group, _ = header(msg, prefix+HeaderConsumerGroup)
	return topic, group
}

// priorAttempts is how often a message moved to a retry topic was handled
// before (its attempts header), 0 for any other.
func (c *Consumer) priorAttempts(msg Message) int {
	if _, moved := header(msg, c.cfg.dlqPrefix+HeaderRetryAt); !moved {
		return 0
	}
	v, _ := header(msg, c.cfg.dlqPrefix+HeaderAttempts)
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0
	}
	return n
}

// retried returns priorAttempts of msg once its retry-at has come (at
// once for a message that was never moved); an error when ctx ends first.
func (c *Consumer) retried(ctx context.Context, msg Message) (int, error) {
	v, moved := header(msg, c.cfg.dlqPrefix+HeaderRetryAt)
	if !moved {
		return 0, nil
	}
	if ms, err := strconv.ParseInt(v, 10, 64); err == nil {
		if d := time.Until(time.UnixMilli(ms)); d > 0 {
			t := time.NewTimer(d)
			defer t.Stop()
			select {
			case <-t.C:
			case <-ctx.Done():
				return 0, context.Cause(ctx)
			}
		}
	}
	return c.priorAttempts(msg), nil
}

// outHeaders are the headers of msg as this Consumer writes it to the
// dead-letter or the retry topic: the application's own, then the
// coordinates and group of its first consumption (a moved message keeps
// the ones it carries), the stored key, the error and the attempts so
// far. Headers of those names already there (from an earlier move) are
// replaced, and retry-at is dropped.
func (c *Consumer) outHeaders(msg Message, key idemdriver.Key, cause error, attempts int) []Header {
	p := c.cfg.dlqPrefix
	topic, partition, offset, group := msg.Topic, strconv.Itoa(msg.Partition), strconv.FormatInt(msg.Offset, 10), c.cfg.group
	if _, moved := header(msg, p+HeaderRetryAt); moved {
		topic, group = origin(msg, p)
		if v, ok := header(msg, p+HeaderOriginalPartition); ok {
			partition = v
		}
		if v, ok := header(msg, p+HeaderOriginalOffset); ok {
			offset = v
		}
	}
	ours := []string{HeaderOriginalTopic, HeaderOriginalPartition, HeaderOriginalOffset, HeaderIdempotencyKey,
		HeaderError, HeaderAttempts, HeaderConsumerGroup, HeaderRetryAt}
	hs := make([]Header, 0, len(msg.Headers)+8)
	for _, h := range msg.Headers {
		if !strings.HasPrefix(h.Key, p) || !slices.Contains(ours, h.Key[len(p):]) {
			hs = append(hs, h)
		}
	}
	return append(hs,
		Header{Key: p + HeaderOriginalTopic, Value: []byte(topic)},
		Header{Key: p + HeaderOriginalPartition, Value: []byte(partition)},
		Header{Key: p + HeaderOriginalOffset, Value: []byte(offset)},
		Header{Key: p + HeaderIdempotencyKey, Value: []byte(key.String())},
		Header{Key: p + HeaderError, Value: []byte(cause.Error())},
		Header{Key: p + HeaderAttempts, Value: []byte(strconv.Itoa(attempts))},
		Header{Key: p + HeaderConsumerGroup, Value: []byte(group)},
	)
}

// moveToRetry publishes msg to the retry topic (WithRetryTopic) after its
// handler failed attempts times in all, recorded under the message's
// coordinates so that a redelivery of it is not moved again.
func (c *Consumer) moveToRetry(ctx context.Context, msg Message, key idemdriver.Key, cause error, attempts int) observe.Outcome {
	hs := append(c.outHeaders(msg, key, cause, attempts), Header{
		Key:   c.cfg.dlqPrefix + HeaderRetryAt,
		Value: []byte(strconv.FormatInt(time.Now().Add(c.cfg.retryDelay+time.Millisecond-1).UnixMilli(), 10)), // rounded up
	})
	moved := Message{Topic: c.cfg.retryTopic, Key: msg.Key, Value: msg.Value, Headers: hs}
	return c.onceAt(ctx, msg, "moved", func(ctx context.Context) ([]byte, error) {
		if err := c.write(ctx, c.cfg.retry, moved, &c.stats.Deferred); err != nil {
			return nil, fmt.Errorf("kafkamw: move %s/%d@%d to the retry topic: %w", msg.Topic, msg.Partition, msg.Offset, err)
		}
		return resultDeferred, nil
	})
}

// deadLetter publishes msg to the dead-letter destination, retrying until
// it is written or ctx ends.
func (c *Consumer) deadLetter(ctx context.Context, msg Message, key idemdriver.Key, cause error, attempts int) error {
	dl := Message{Topic: c.cfg.dlqTopic, Key: msg.Key, Value: msg.Value, Headers: c.outHeaders(msg, key, cause, attempts)}
	if err := c.write(ctx, c.cfg.dlq, dl, &c.stats.DeadLettered); err != nil {
		return fmt.Errorf("kafkamw: dead-letter %s/%d@%d: %w", msg.Topic, msg.Partition, msg.Offset, err)
	}
	return nil
}

func (c *Consumer) count(res []byte, replayed bool) observe.Outcome {
	switch {
	case replayed:
		c.add(&c.stats.Duplicates)
		return observe.Duplicate
	case len(res) == 1 && res[0] == resultDeadLettered[0]:
		return observe.DeadLettered // counted when it was written
	case len(res) == 1 && res[0] == resultDeferred[0]:
		return observe.Deferred // counted when it was written
	}
	c.add(&c.stats.Handled)
	return observe.Executed
}

func (c *Consumer) add(n *int64) {
	c.mu.Lock()
	*n++
	c.mu.Unlock()
}

// sleep waits the n-th backoff (exponential, jittered); false when ctx
// ended first.
func (c *Consumer) sleep(ctx context.Context, n int) bool {
	d := c.cfg.backoff
	for i := 1; i < n && d < c.cfg.maxBackoff; i++ {
		d *= 2
	}
	d = min(d, c.cfg.maxBackoff)
	t := time.NewTimer(d/2 + rand.N(d/2+1))
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
