package kafkamw_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/observe"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/kafkamw"
	"github.com/oncekit/oncekit/storage/memstore"
)

// 10,000 messages of which 20 % are duplicates (a producer that sent a
// logical message again): the handler's effects are the unique messages,
// each once, and every offset is committed.
func TestDuplicatesRunOnce(t *testing.T) {
	eachStore(t, func(t *testing.T, st idemdriver.Store) {
		brokers := testenv.KafkaBrokers(t)
		const partitions, unique, dups = 4, 8000, 2000
		topic := testenv.KafkaTopic(t, brokers, partitions)
		msgs, want := messages(unique, 0)
		for range dups { // a duplicate lands after its original, anywhere
			at := unique/2 + rand.N(len(msgs)-unique/2)
			dup := message(rand.N(unique / 2))
			msgs = append(msgs[:at], append([]kafka.Message{dup}, msgs[at:]...)...)
		}
		produce(t, newWriter(t, brokers, topic), msgs)

		eff := newEffects()
		group := "g-" + topic
		c, err := kafkamw.NewConsumer(kafkamw.KafkaGoReader(newReader(t, brokers, topic, group)), newGuard(t, st),
			func(ctx context.Context, m kafkamw.Message) error {
				if k, ok := idem.KeyFrom(ctx); !ok || k == "" {
					return errors.New("no stored key in the handler's context")
				}
				eff.Add(idOf(m))
				return nil
			}, kafkamw.WithConcurrency(4))
		if err != nil {
			t.Fatal(err)
		}
		stop := run(t, c)
		waitFor(t, 2*time.Minute, "every message", func() bool { return c.Stats().Fetched >= unique+dups && eff.Distinct() >= unique })
		waitFor(t, 30*time.Second, "every offset committed", func() bool {
			s := c.Stats()
			return s.Handled+s.Duplicates == unique+dups
		})
		if err := stop(); err != nil {
			t.Fatalf("Run: %v", err)
		}
		eff.Check(t, want)
		s := c.Stats()
		if s.Handled != unique || s.Duplicates != dups {
			t.Errorf("stats %+v: want %d handled, %d duplicates", s, unique, dups)
		}
		if !allCommitted(t, brokers, topic, group, partitions) {
			t.Errorf("committed offsets %v, want the ends %v", committed(t, brokers, topic, group, partitions), ends(t, brokers, topic, partitions))
		}
	})
}

// A message whose handler always fails is dead-lettered after its attempts,
// with its coordinates and the error in headers, and its partition moves
// on; a Permanent error is dead-lettered at once.
func TestPoisonMessageDeadLettered(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	topic := testenv.KafkaTopic(t, brokers, 1)
	dlqTopic := testenv.KafkaTopic(t, brokers, 1)
	msgs := make([]kafka.Message, 50)
	for i := range msgs {
		msgs[i] = message(i)
	}
	produce(t, newWriter(t, brokers, topic), msgs)

	var calls sync.Map // id -> *atomic.Int64
	var attempts []int // m-10's runs' idem.AttemptFrom
	eff := newEffects()
	c, err := kafkamw.NewConsumer(kafkamw.KafkaGoReader(newReader(t, brokers, topic, "g-"+topic)), newGuard(t, memstore.New()),
		func(ctx context.Context, m kafkamw.Message) error {
			n, _ := calls.LoadOrStore(idOf(m), new(atomic.Int64))
			n.(*atomic.Int64).Add(1)
			switch idOf(m) {
			case "m-10":
				a, _ := idem.AttemptFrom(ctx)
				attempts = append(attempts, a)
				return errors.New("boom")
			case "m-20":
				return kafkamw.Permanent(errors.New("cannot parse"))
			case "m-30":
				panic("handler bug")
			}
			eff.Add(idOf(m))
			return nil
		},
		kafkamw.WithRetry(3, time.Millisecond, 10*time.Millisecond),
		kafkamw.WithDeadLetter(kafkamw.KafkaGoWriter(newWriter(t, brokers, dlqTopic)), ""))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	waitFor(t, time.Minute, "the partition to move on", func() bool { return eff.Distinct() == 47 })
	waitFor(t, 10*time.Second, "dead letters", func() bool { return c.Stats().DeadLettered == 3 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]int64{"m-10": 3, "m-20": 1, "m-30": 3, "m-11": 1} {
		n, _ := calls.Load(id)
		if got := n.(*atomic.Int64).Load(); got != want {
			t.Errorf("%s: handler called %d times, want %d", id, got, want)
		}
	}
	if got := committed(t, brokers, topic, "g-"+topic, 1)[0]; got != 50 {
		t.Errorf("committed offset %d, want 50", got)
	}
	if !slices.Equal(attempts, []int{1, 2, 3}) {
		t.Errorf("m-10's handler saw attempts %v, want [1 2 3]: each retry knows it is one", attempts)
	}

	r := newReader(t, brokers, dlqTopic, "")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, want := range []struct{ id, offset, err, attempts string }{
		{"m-10", "10", "boom", "3"}, {"m-20", "20", "cannot parse", "1"}, {"m-30", "30", "kafkamw: handler panicked: handler bug", "3"},
	} {
		m, err := r.ReadMessage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		h, p := headers(m), kafkamw.DefaultDeadLetterPrefix
		if string(m.Key) != want.id || h[p+kafkamw.HeaderOriginalTopic] != topic || h[p+kafkamw.HeaderOriginalPartition] != "0" ||
			h[p+kafkamw.HeaderOriginalOffset] != want.offset || h[p+kafkamw.HeaderError] != want.err ||
			h[kafkamw.DefaultKeyHeader] != want.id || h[p+kafkamw.HeaderIdempotencyKey] == "" ||
			h[p+kafkamw.HeaderAttempts] != want.attempts || h[p+kafkamw.HeaderConsumerGroup] != "g-"+topic {
			t.Errorf("dead letter %s: headers %v", string(m.Key), h)
		}
	}
}

func headers(m kafka.Message) map[string]string {
	out := map[string]string{}
	for _, h := range m.Headers {
		out[h.Key] = string(h.Value)
	}
	return out
}

// Messages that cannot be keyed — an empty or malformed message-id, a key
// reused with another payload, no key when keys are required — are
// dead-lettered with the reason, never handled unkeyed.
func TestBadKeysDeadLettered(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	topic := testenv.KafkaTopic(t, brokers, 1)
	dlqTopic := testenv.KafkaTopic(t, brokers, 1)
	bad := func(id string) kafka.Message {
		return kafka.Message{Key: []byte("x"), Value: []byte("v"), Headers: []kafka.Header{{Key: kafkamw.DefaultKeyHeader, Value: []byte(id)}}}
	}
	reused := message(1)
	reused.Value = []byte("another payload")
	produce(t, newWriter(t, brokers, topic), []kafka.Message{
		message(0), bad(""), bad("has space"), bad(string(make([]byte, 300))), message(1), reused,
		{Key: []byte("nokey"), Value: []byte("v")}, message(2),
	})
	eff := newEffects()
	c, err := kafkamw.NewConsumer(kafkamw.KafkaGoReader(newReader(t, brokers, topic, "g-"+topic)), newGuard(t, memstore.New()),
		func(ctx context.Context, m kafkamw.Message) error { eff.Add(idOf(m)); return nil },
		kafkamw.WithRequireKey(), kafkamw.WithDeadLetter(kafkamw.KafkaGoWriter(newWriter(t, brokers, dlqTopic)), ""))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	waitFor(t, time.Minute, "all messages", func() bool { s := c.Stats(); return s.Handled == 3 && s.DeadLettered == 5 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	eff.Check(t, map[string]bool{"m-0": true, "m-1": true, "m-2": true})
	if got := committed(t, brokers, topic, "g-"+topic, 1)[0]; got != 8 {
		t.Errorf("committed offset %d, want 8", got)
	}
}

// The producer's key survives a write that reached the broker but whose
// answer was lost: the retry writes the same key again, and the consumer
// runs the message once.
func TestProducerKeepsKeyAcrossRetries(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	topic := testenv.KafkaTopic(t, brokers, 1)
	w := &lostAck{w: kafkamw.KafkaGoWriter(newWriter(t, brokers, topic))}
	p, err := kafkamw.NewProducer(w, kafkamw.WithSendRetries(3, time.Millisecond, 10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.Send(ctx, kafkamw.Message{Key: []byte("order-1"), Value: []byte("created")}); err != nil {
		t.Fatal(err)
	}
	if w.calls != 2 {
		t.Fatalf("%d writes, want 2 (one lost answer, one retry)", w.calls)
	}
	var runs atomic.Int64
	rec := &recorder{}
	c, err := kafkamw.NewConsumer(kafkamw.KafkaGoReader(newReader(t, brokers, topic, "g-"+topic)), newGuard(t, memstore.New(), idem.WithObserver(rec)),
		func(ctx context.Context, m kafkamw.Message) error { runs.Add(1); return nil })
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	waitFor(t, time.Minute, "both copies", func() bool { s := c.Stats(); return s.Handled+s.Duplicates == 2 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if runs.Load() != 1 || c.Stats().Duplicates != 1 {
		t.Errorf("handler ran %d times (stats %+v), want once", runs.Load(), c.Stats())
	}
	// Each message is reported to the Guard's observer, by topic.
	if got := rec.outcomes(kafkamw.OpMessage, topic); fmt.Sprint(got) != "[executed duplicate]" {
		t.Errorf("kafka.message outcomes %v, want [executed duplicate]", got)
	}
}

// recorder is an observe.Observer that keeps the events it ends.
type recorder struct {
	mu     sync.Mutex
	events []observe.Event
}

func (r *recorder) Start(ctx context.Context, _ observe.Event) context.Context { return ctx }
func (r *recorder) Record(context.Context, observe.Event)                      {}
func (r *recorder) End(_ context.Context, ev observe.Event) {
	r.mu.Lock()
	r.events = append(r.events, ev)
	r.mu.Unlock()
}

func (r *recorder) outcomes(op observe.Op, route string) []observe.Outcome {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []observe.Outcome
	for _, ev := range r.events {
		if ev.Op == op && ev.Route == route {
			out = append(out, ev.Outcome)
		}
	}
	return out
}

// lostAck writes, then reports a failure for its first call: the message
// reached the broker, the producer did not hear so.
type lostAck struct {
	w     kafkamw.Writer
	calls int
}

func (l *lostAck) WriteMessages(ctx context.Context, msgs ...kafkamw.Message) error {
	l.calls++
	if err := l.w.WriteMessages(ctx, msgs...); err != nil {
		return err
	}
	if l.calls == 1 {
		return errors.New("connection reset before the answer")
	}
	return nil
}

// Shutdown lets the handler in flight finish with its context intact and
// commits its offset before Run returns.
func TestGracefulShutdown(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	topic := testenv.KafkaTopic(t, brokers, 1)
	produce(t, newWriter(t, brokers, topic), []kafka.Message{message(0), message(1)})
	started, release := make(chan struct{}), make(chan struct{})
	var ctxErr error
	c, err := kafkamw.NewConsumer(kafkamw.KafkaGoReader(newReader(t, brokers, topic, "g-"+topic)), newGuard(t, memstore.New()),
		func(ctx context.Context, m kafkamw.Message) error {
			if idOf(m) == "m-0" {
				close(started)
				<-release
				ctxErr = ctx.Err()
			}
			return nil
		}, kafkamw.WithPipeline(1))
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- c.Run(context.Background()) }()
	<-started
	shut := make(chan error, 1)
	go func() { shut <- c.Shutdown(context.Background()) }()
	select {
	case err := <-errc:
		t.Fatalf("Run returned %v with a handler in flight", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	if err := <-shut; err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("Run after Shutdown: %v", err)
	}
	if ctxErr != nil {
		t.Errorf("the handler's context ended during a graceful shutdown: %v", ctxErr)
	}
	if got := committed(t, brokers, topic, "g-"+topic, 1)[0]; got != 1 {
		t.Errorf("committed offset %d, want 1 (m-0 done, m-1 never started)", got)
	}
}

func TestNewConsumerRejectsBadInput(t *testing.T) {
	g := newGuard(t, memstore.New())
	h := func(context.Context, kafkamw.Message) error { return nil }
	rawNoGroup := kafka.NewReader(kafka.ReaderConfig{Brokers: []string{"127.0.0.1:1"}, Topic: "t"})
	defer rawNoGroup.Close()
	rawWithGroup := kafka.NewReader(kafka.ReaderConfig{Brokers: []string{"127.0.0.1:1"}, Topic: "t", GroupID: "g"})
	defer rawWithGroup.Close()
	noGroup, withGroup := kafkamw.KafkaGoReader(rawNoGroup), kafkamw.KafkaGoReader(rawWithGroup)
	for name, tc := range map[string]struct {
		r    kafkamw.Reader
		g    *idem.Guard
		h    kafkamw.Handler
		opts []kafkamw.Option
	}{
		"nil reader":           {nil, g, h, nil},
		"nil guard":            {withGroup, nil, h, nil},
		"nil handler":          {withGroup, g, nil, nil},
		"reader with no group": {noGroup, g, h, nil},
		"empty key header":     {withGroup, g, h, []kafkamw.Option{kafkamw.WithKeyHeader("")}},
		"zero concurrency":     {withGroup, g, h, []kafkamw.Option{kafkamw.WithConcurrency(0)}},
		"zero pipeline":        {withGroup, g, h, []kafkamw.Option{kafkamw.WithPipeline(0)}},
		"zero attempts":        {withGroup, g, h, []kafkamw.Option{kafkamw.WithRetry(0, time.Second, time.Second)}},
		"backoff over max":     {withGroup, g, h, []kafkamw.Option{kafkamw.WithRetry(3, time.Second, time.Millisecond)}},
		"nil dead letter":      {withGroup, g, h, []kafkamw.Option{kafkamw.WithDeadLetter(nil, "dlq")}},
	} {
		if c, err := kafkamw.NewConsumer(tc.r, tc.g, tc.h, tc.opts...); err == nil || c != nil {
			t.Errorf("%s: NewConsumer = %v, %v; want an error", name, c, err)
		}
	}
	if _, err := kafkamw.NewProducer(nil); err == nil {
		t.Error("NewProducer(nil): no error")
	}
}

// WithFingerprint: a producer that resends a logical message with a new
// timestamp and its JSON re-serialised sends the same message (committed
// as a duplicate) when the fingerprint leaves the timestamp out; a message
// the fingerprint cannot read stops a Consumer without a dead-letter
// destination with a *PoisonError at its offset.
func TestFingerprint(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	topic := testenv.KafkaTopic(t, brokers, 1)
	msg := func(id, value string) kafka.Message {
		return kafka.Message{Key: []byte(id), Value: []byte(value), Headers: []kafka.Header{{Key: kafkamw.DefaultKeyHeader, Value: []byte(id)}}}
	}
	produce(t, newWriter(t, brokers, topic), []kafka.Message{
		msg("m-1", `{"order":"o-1","sent_at":1}`),
		msg("m-1", `{ "sent_at": 2, "order": "o-1" }`),
		msg("m-2", `not json`),
	})
	var handled atomic.Int64
	c, err := kafkamw.NewConsumer(kafkamw.KafkaGoReader(newReader(t, brokers, topic, "g-"+topic)), newGuard(t, memstore.New()),
		func(ctx context.Context, m kafkamw.Message) error { handled.Add(1); return nil },
		kafkamw.WithFingerprint(func(m kafkamw.Message) (string, error) {
			var v map[string]any
			if err := json.Unmarshal(m.Value, &v); err != nil {
				return "", err
			}
			delete(v, "sent_at")
			b, _ := json.Marshal(v) // map members sorted
			return idem.Fingerprint([]byte(m.Topic), b), nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = c.Run(ctx)
	var pe *kafkamw.PoisonError
	if !errors.As(err, &pe) || pe.Offset != 2 {
		t.Fatalf("Run: %v, want a *PoisonError for offset 2", err)
	}
	if s := c.Stats(); handled.Load() != 1 || s.Duplicates != 1 {
		t.Errorf("%d runs, stats %+v; want one run and one duplicate", handled.Load(), s)
	}
	if _, err := kafkamw.NewConsumer(kafkamw.KafkaGoReader(newReader(t, brokers, topic, "g2-"+topic)), newGuard(t, memstore.New()),
		func(context.Context, kafkamw.Message) error { return nil }, kafkamw.WithFingerprint(nil)); err == nil {
		t.Error("a nil fingerprint function was accepted")
	}
}

// WithRetryTopic: a failing message leaves its partition after one call
// and waits its delay on the retry topic, where a second Consumer (the
// same handler and options) handles it with the original's key: m-3 fails
// twice (moved, then moved again) and then succeeds, once; m-7 always fails and is dead-lettered
// after three calls in all, with its original coordinates; the messages
// behind them are not held up; a duplicate of m-3 sent to the original
// topic afterwards is a duplicate.
func TestRetryTopic(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	topic := testenv.KafkaTopic(t, brokers, 1)
	retryTopic := testenv.KafkaTopic(t, brokers, 1)
	dlqTopic := testenv.KafkaTopic(t, brokers, 1)
	msgs := make([]kafka.Message, 10)
	for i := range msgs {
		msgs[i] = message(i)
	}
	main := newWriter(t, brokers, topic)
	produce(t, main, msgs)

	var mu sync.Mutex
	var order []string                // successful handlings
	calls := map[string][]time.Time{} // every call, by message
	handler := func(ctx context.Context, m kafkamw.Message) error {
		mu.Lock()
		defer mu.Unlock()
		id := idOf(m)
		calls[id] = append(calls[id], time.Now())
		if id == "m-7" || (id == "m-3" && len(calls[id]) < 3) {
			return fmt.Errorf("%s not yet", id)
		}
		order = append(order, id)
		return nil
	}
	const delay = 300 * time.Millisecond
	st := memstore.New()
	opts := []kafkamw.Option{
		kafkamw.WithRetry(3, time.Millisecond, time.Millisecond),
		kafkamw.WithRetryTopic(kafkamw.KafkaGoWriter(newWriter(t, brokers, retryTopic)), "", 1, delay),
		kafkamw.WithDeadLetter(kafkamw.KafkaGoWriter(newWriter(t, brokers, dlqTopic)), ""),
	}
	first, err := kafkamw.NewConsumer(kafkamw.KafkaGoReader(newReader(t, brokers, topic, "g-"+topic)), newGuard(t, st), handler, opts...)
	if err != nil {
		t.Fatal(err)
	}
	retrier, err := kafkamw.NewConsumer(kafkamw.KafkaGoReader(newReader(t, brokers, retryTopic, "g-"+retryTopic)), newGuard(t, st), handler,
		append(opts, kafkamw.WithGroup("g-"+topic))...)
	if err != nil {
		t.Fatal(err)
	}
	stopFirst, stopRetrier := run(t, first), run(t, retrier)
	waitFor(t, time.Minute, "m-3 handled and m-7 dead-lettered", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return slices.Contains(order, "m-3") && retrier.Stats().DeadLettered == 1
	})
	mu.Lock()
	if at := slices.Index(order, "m-3"); at != len(order)-1 || len(order) != 9 {
		t.Errorf("handled in the order %q: want m-3 last, after the eight others", order)
	}
	for _, id := range []string{"m-3", "m-7"} {
		if c := calls[id]; len(c) != 3 || c[1].Sub(c[0]) < delay || c[2].Sub(c[1]) < delay {
			t.Errorf("%s called at %v: want three calls, %s apart", id, c, delay)
		}
	}
	mu.Unlock()
	if s := first.Stats(); s.Deferred != 2 || s.Handled != 8 {
		t.Errorf("first consumer %+v: want 2 moved, 8 handled", s)
	}
	if s := retrier.Stats(); s.Deferred != 2 || s.Handled != 1 || s.DeadLettered != 1 {
		t.Errorf("retry consumer %+v: want 2 moved again, 1 handled, 1 dead-lettered", s)
	}

	dl, h := deadLetter(t, newReader(t, brokers, dlqTopic, ""))
	if string(dl.Key) != "m-7" || h[kafkamw.HeaderOriginalTopic] != topic || h[kafkamw.HeaderOriginalOffset] != "7" ||
		h[kafkamw.HeaderAttempts] != "3" || h[kafkamw.HeaderConsumerGroup] != "g-"+topic || h[kafkamw.HeaderRetryAt] != "" ||
		len(dl.Headers) != len(h)+1 { // and message-id
		t.Errorf("dead letter %s: headers %v", string(dl.Key), h)
	}

	produce(t, main, []kafka.Message{message(3)})
	waitFor(t, time.Minute, "the duplicate of m-3", func() bool { return first.Stats().Duplicates == 1 })
	if err := errors.Join(stopFirst(), stopRetrier()); err != nil {
		t.Fatal(err)
	}
	if len(order) != 9 {
		t.Errorf("handled %q after the duplicate", order)
	}
}
