package kafkamw_test

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/goleak"

	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/kafkamw"
	"github.com/oncekit/oncekit/kafkamw/internal/kafkatest"
)

func TestMain(m *testing.M) {
	kafkatest.RunChild(func(brokers []string, topic, group string) (kafkamw.Reader, io.Closer, error) {
		r := kafka.NewReader(kafkatest.ReaderConfig(brokers, topic, group))
		return kafkamw.KafkaGoReader(r), r, nil
	})
	goleak.VerifyTestMain(m)
}

// The scenarios every Reader runs (kafkatest), on kafka-go's; the
// adapters' modules run them on theirs.
func TestPartitionOrder(t *testing.T) { kafkatest.PartitionOrder(t, kafkatest.KafkaGo) }

func TestPoisonWithoutDeadLetterStops(t *testing.T) {
	kafkatest.PoisonWithoutDeadLetterStops(t, kafkatest.KafkaGo)
}

func TestStoreAway(t *testing.T) {
	t.Parallel() // (topics and a store of its own)
	kafkatest.StoreAway(t, kafkatest.KafkaGo)
}

func TestKilledConsumer(t *testing.T) {
	t.Parallel() // (topics, groups and store of its own)
	kafkatest.KilledConsumer(t)
}

// Two consumers in one group: the second joins mid-stream and the first
// leaves mid-stream, two rebalances; each message's handler still runs once.
func TestRebalance(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	const partitions, unique, dups = 4, 4000, 400
	topic := testenv.KafkaTopic(t, brokers, partitions)
	msgs, want := messages(unique, dups)
	produce(t, newWriter(t, brokers, topic), msgs)

	st := newRedisStore(t, testenv.RedisAddrs(t, 1)[0])
	eff := newEffects()
	handler := func(ctx context.Context, m kafkamw.Message) error {
		time.Sleep(300 * time.Microsecond)
		eff.Add(idOf(m))
		return nil
	}
	group := "g-" + topic
	newConsumer := func() (*kafkamw.Consumer, *kafka.Reader) {
		r := newReader(t, brokers, topic, group)
		c, err := kafkamw.NewConsumer(kafkamw.KafkaGoReader(r), newGuard(t, st), handler, kafkamw.WithConcurrency(2))
		if err != nil {
			t.Fatal(err)
		}
		return c, r
	}
	a, readerA := newConsumer()
	stopA := run(t, a)
	waitFor(t, time.Minute, "the first consumer to start", func() bool { return eff.Distinct() >= 500 })
	b, _ := newConsumer()
	stopB := run(t, b)
	waitFor(t, time.Minute, "the second consumer to take partitions", func() bool { return b.Stats().Fetched > 0 })
	waitFor(t, time.Minute, "progress", func() bool { return eff.Distinct() >= 2500 })
	if err := stopA(); err != nil {
		t.Fatalf("first consumer: %v", err)
	}
	readerA.Close() // leaves the group: the second consumer takes every partition
	waitFor(t, 2*time.Minute, "every message", func() bool { return eff.Distinct() == unique })
	waitFor(t, 30*time.Second, "every offset committed", func() bool { return allCommitted(t, brokers, topic, group, partitions) })
	if err := stopB(); err != nil {
		t.Fatalf("second consumer: %v", err)
	}
	eff.Check(t, want)
	t.Logf("first %+v", a.Stats())
	t.Logf("second %+v", b.Stats())
}
