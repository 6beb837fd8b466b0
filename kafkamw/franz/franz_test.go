package franz_test

import (
	"context"
	"io"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/kafkamw"
	"github.com/oncekit/oncekit/kafkamw/franz"
	"github.com/oncekit/oncekit/kafkamw/internal/kafkatest"
	"github.com/oncekit/oncekit/storage/memstore"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	kafkatest.RunChild(func(brokers []string, topic, group string) (kafkamw.Reader, io.Closer, error) {
		r, err := franz.NewReader(franzReaderOpts(brokers, topic, group)...)
		return r, r, err
	})
	goleak.VerifyTestMain(m)
}

// The scenarios every Reader runs (kafkatest), on franz-go's.
func TestPartitionOrder(t *testing.T) { kafkatest.PartitionOrder(t, franzReader) }

func TestPoisonWithoutDeadLetterStops(t *testing.T) {
	kafkatest.PoisonWithoutDeadLetterStops(t, franzReader)
}

func TestStoreAway(t *testing.T) {
	t.Parallel()
	kafkatest.StoreAway(t, franzReader)
}

func TestKilledConsumer(t *testing.T) {
	t.Parallel()
	kafkatest.KilledConsumer(t)
}

func franzReader(t testing.TB, brokers []string, topic, group string) kafkamw.Reader {
	return newFranzReader(t, brokers, topic, group)
}

// newFranzReader is a group member over franz-go with short timeouts, as
// kafkatest.NewReader is over kafka-go.
func newFranzReader(t testing.TB, brokers []string, topic, group string) *franz.Reader {
	r, err := franz.NewReader(franzReaderOpts(brokers, topic, group)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}

// franzReaderOpts are newFranzReader's options (also the consumer
// processes' of TestKilledConsumer).
func franzReaderOpts(brokers []string, topic, group string) []kgo.Opt {
	return []kgo.Opt{kgo.SeedBrokers(brokers...), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(50 * time.Millisecond),
		kgo.SessionTimeout(6 * time.Second), kgo.HeartbeatInterval(100 * time.Millisecond), kgo.RebalanceTimeout(2 * time.Second)}
}

func newFranzWriter(t testing.TB, brokers []string, topic string) *franz.Writer {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ProducerLinger(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return franz.NewWriter(cl, topic)
}

// The duplicates test on franz-go: messages written through a Producer
// over franz.Writer, 20 % of them sent again, consumed through
// franz.Reader: each unique message's effect once, every offset committed.
func TestFranzDuplicatesRunOnce(t *testing.T) {
	kafkatest.EachStore(t, func(t *testing.T, st idemdriver.Store) {
		brokers := testenv.KafkaBrokers(t)
		const partitions, unique, dups = 4, 2000, 500
		topic := testenv.KafkaTopic(t, brokers, partitions)
		msgs, want := kafkatest.Messages(unique, 0)
		for range dups {
			at := unique/2 + rand.N(len(msgs)-unique/2)
			msgs = append(msgs[:at], append([]kafka.Message{kafkatest.Message(rand.N(unique / 2))}, msgs[at:]...)...)
		}
		p, err := kafkamw.NewProducer(newFranzWriter(t, brokers, topic))
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < len(msgs); i += 500 {
			if err := p.Send(t.Context(), kafkatest.Kafkamw(msgs[i:min(i+500, len(msgs))])...); err != nil {
				t.Fatal(err)
			}
		}
		eff := kafkatest.NewEffects()
		group := "g-" + topic
		c, err := kafkamw.NewConsumer(newFranzReader(t, brokers, topic, group), kafkatest.NewGuard(t, st),
			func(ctx context.Context, m kafkamw.Message) error { eff.Add(kafkatest.IDOf(m)); return nil }, kafkamw.WithConcurrency(4))
		if err != nil {
			t.Fatal(err)
		}
		stop := kafkatest.Run(t, c)
		kafkatest.WaitFor(t, 2*time.Minute, "every offset committed", func() bool {
			s := c.Stats()
			return s.Handled+s.Duplicates == unique+dups && kafkatest.AllCommitted(t, brokers, topic, group, partitions)
		})
		if err := stop(); err != nil {
			t.Fatalf("Run: %v", err)
		}
		eff.Check(t, want)
		if s := c.Stats(); s.Handled != unique || s.Duplicates != dups {
			t.Errorf("stats %+v: want %d handled, %d duplicates", s, unique, dups)
		}
	})
}

// A rebalance on franz-go: two members share four partitions, one shuts
// down mid-stream and the other takes its partitions over. Every message's
// effect happens once and every offset ends committed.
func TestFranzRebalance(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	const partitions, n = 4, 3000
	topic := testenv.KafkaTopic(t, brokers, partitions)
	msgs, want := kafkatest.Messages(n, 0)
	kafkatest.Produce(t, kafkatest.NewWriter(t, brokers, topic), msgs)
	st := memstore.New()
	eff := kafkatest.NewEffects()
	var handled atomic.Int64
	handler := func(ctx context.Context, m kafkamw.Message) error {
		eff.Add(kafkatest.IDOf(m))
		handled.Add(1)
		time.Sleep(200 * time.Microsecond)
		return nil
	}
	group := "g-" + topic
	newConsumer := func() (*kafkamw.Consumer, *franz.Reader) {
		r := newFranzReader(t, brokers, topic, group)
		c, err := kafkamw.NewConsumer(r, kafkatest.NewGuard(t, st), handler, kafkamw.WithConcurrency(2))
		if err != nil {
			t.Fatal(err)
		}
		return c, r
	}
	a, _ := newConsumer()
	b, rb := newConsumer()
	stopA, stopB := kafkatest.Run(t, a), kafkatest.Run(t, b)
	kafkatest.WaitFor(t, time.Minute, "a third of the messages", func() bool { return handled.Load() >= n/3 })
	if err := stopB(); err != nil {
		t.Fatalf("the leaving member's Run: %v", err)
	}
	_ = rb.Close() // leaves the group: its partitions go to the other member
	kafkatest.WaitFor(t, 2*time.Minute, "every offset committed", func() bool {
		return eff.Distinct() == n && kafkatest.AllCommitted(t, brokers, topic, group, partitions)
	})
	if err := stopA(); err != nil {
		t.Fatal(err)
	}
	eff.Check(t, want)
	if b.Stats().Fetched == 0 {
		t.Error("the second member never got a partition: no rebalance was tested")
	}
}

// A dead letter written through franz.Writer carries the original and the
// prefixed headers, as over kafka-go.
func TestFranzDeadLetter(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	topic, dlqTopic := testenv.KafkaTopic(t, brokers, 1), testenv.KafkaTopic(t, brokers, 1)
	kafkatest.Produce(t, kafkatest.NewWriter(t, brokers, topic), []kafka.Message{kafkatest.Message(0), kafkatest.Message(1), kafkatest.Message(2)})
	c, err := kafkamw.NewConsumer(newFranzReader(t, brokers, topic, "g-"+topic), kafkatest.NewGuard(t, memstore.New()),
		func(ctx context.Context, m kafkamw.Message) error {
			if kafkatest.IDOf(m) == "m-1" {
				return kafkamw.Permanent(context.DeadlineExceeded)
			}
			return nil
		}, kafkamw.WithDeadLetter(newFranzWriter(t, brokers, dlqTopic), ""))
	if err != nil {
		t.Fatal(err)
	}
	stop := kafkatest.Run(t, c)
	kafkatest.WaitFor(t, time.Minute, "every offset committed", func() bool { return kafkatest.AllCommitted(t, brokers, topic, "g-"+topic, 1) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	dl, h := kafkatest.DeadLetter(t, kafkatest.NewReader(t, brokers, dlqTopic, ""))
	if string(dl.Key) != "m-1" || h[kafkamw.HeaderOriginalTopic] != topic || h[kafkamw.HeaderOriginalOffset] != "1" ||
		h[kafkamw.HeaderConsumerGroup] != "g-"+topic || h[kafkamw.HeaderAttempts] != "1" {
		t.Errorf("dead letter %s: headers %v", string(dl.Key), h)
	}
}
