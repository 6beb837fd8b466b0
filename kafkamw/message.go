package kafkamw

import (
	"context"
	"time"

	"github.com/segmentio/kafka-go"
)

// Message is one Kafka record, whichever client carries it: what a Reader
// fetches, a Handler handles, a Producer sends and a Writer writes.
// KafkaGoReader and KafkaGoWriter adapt segmentio/kafka-go's client;
// kafkamw/franz adapts franz-go's.
type Message struct {
	Topic     string
	Partition int
	Offset    int64
	Key       []byte
	Value     []byte
	Headers   []Header
	Time      time.Time
}

// Header is one of a record's headers.
type Header struct {
	Key   string
	Value []byte
}

// KafkaGoReader adapts a kafka-go Reader, which must have a GroupID, to a
// Consumer (its CommitInterval should be 0: the Consumer batches commits
// itself).
func KafkaGoReader(r *kafka.Reader) Reader { return kafkaGoReader{r} }

type kafkaGoReader struct{ r *kafka.Reader }

func (k kafkaGoReader) FetchMessage(ctx context.Context) (Message, error) {
	m, err := k.r.FetchMessage(ctx)
	if err != nil {
		return Message{}, err
	}
	return fromKafkaGo(m), nil
}

func (k kafkaGoReader) CommitMessages(ctx context.Context, msgs ...Message) error {
	kms := make([]kafka.Message, len(msgs))
	for i, m := range msgs {
		kms[i] = kafka.Message{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset}
	}
	return k.r.CommitMessages(ctx, kms...)
}

// GroupID is the Reader's consumer group.
func (k kafkaGoReader) GroupID() string { return k.r.Config().GroupID }

// KafkaGoWriter adapts a kafka-go Writer to a Producer, a dead-letter
// destination or a retry topic.
func KafkaGoWriter(w *kafka.Writer) Writer { return kafkaGoWriter{w} }

type kafkaGoWriter struct{ w *kafka.Writer }

func (k kafkaGoWriter) WriteMessages(ctx context.Context, msgs ...Message) error {
	kms := make([]kafka.Message, len(msgs))
	for i, m := range msgs {
		kms[i] = toKafkaGo(m)
	}
	return k.w.WriteMessages(ctx, kms...)
}

func fromKafkaGo(m kafka.Message) Message {
	var hs []Header
	if len(m.Headers) > 0 {
		hs = make([]Header, len(m.Headers))
		for i, h := range m.Headers {
			hs[i] = Header{Key: h.Key, Value: h.Value}
		}
	}
	return Message{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset, Key: m.Key, Value: m.Value, Headers: hs, Time: m.Time}
}

func toKafkaGo(m Message) kafka.Message {
	var hs []kafka.Header
	if len(m.Headers) > 0 {
		hs = make([]kafka.Header, len(m.Headers))
		for i, h := range m.Headers {
			hs[i] = kafka.Header{Key: h.Key, Value: h.Value}
		}
	}
	return kafka.Message{Topic: m.Topic, Key: m.Key, Value: m.Value, Headers: hs, Time: m.Time}
}
