package kafkamw_test

import (
	"context"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/kafkamw"
	"github.com/oncekit/oncekit/kafkamw/internal/kafkatest"
)

// BenchmarkConsumer compares the runner over each store with bare kafka-go
// loops on the same broker, in the same run: b.N messages (4 partitions,
// produced before the timer starts) read and committed by a fresh group.
// msgs/s is the figure; the handler does nothing, so it is the runner's own
// cost (a claim and a completion per message) against the broker's.
//
//	go test -run '^$' -bench Consumer -benchtime 20000x ./kafkamw
func BenchmarkConsumer(b *testing.B) {
	brokers := testenv.KafkaBrokers(b)
	const partitions = 4
	prepare := func(b *testing.B) (topic string) {
		topic = testenv.KafkaTopic(b, brokers, partitions)
		msgs := make([]kafka.Message, b.N)
		for i := range msgs {
			msgs[i] = message(i)
		}
		produce(b, newWriter(b, brokers, topic), msgs)
		return topic
	}
	report := func(b *testing.B, start time.Time) {
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
	}

	bare := func(commitEvery int) func(b *testing.B) {
		return func(b *testing.B) {
			topic := prepare(b)
			r := newReader(b, brokers, topic, "g-"+topic)
			ctx := context.Background()
			b.ResetTimer()
			start := time.Now()
			var pending []kafka.Message
			for range b.N {
				m, err := r.FetchMessage(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if pending = append(pending, m); len(pending) >= commitEvery {
					if err := r.CommitMessages(ctx, pending...); err != nil {
						b.Fatal(err)
					}
					pending = pending[:0]
				}
			}
			if len(pending) > 0 {
				if err := r.CommitMessages(ctx, pending...); err != nil {
					b.Fatal(err)
				}
			}
			report(b, start)
		}
	}
	b.Run("bare/commit-each", bare(1))
	b.Run("bare/commit-100", bare(100))

	for _, s := range kafkatest.Stores {
		b.Run("kafkamw/"+s.Name, func(b *testing.B) {
			topic := prepare(b)
			c, err := kafkamw.NewConsumer(kafkamw.KafkaGoReader(newReader(b, brokers, topic, "g-"+topic)), newGuard(b, s.New(b)),
				func(context.Context, kafkamw.Message) error { return nil }, kafkamw.WithConcurrency(partitions))
			if err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			start := time.Now()
			errc := make(chan error, 1)
			go func() { errc <- c.Run(context.Background()) }()
			for {
				st := c.Stats()
				if st.Handled+st.Duplicates >= int64(b.N) {
					break
				}
				time.Sleep(time.Millisecond)
			}
			if err := c.Shutdown(context.Background()); err != nil { // commits what is done
				b.Fatal(err)
			}
			report(b, start)
			if err := <-errc; err != nil {
				b.Fatal(err)
			}
		})
	}
}
