package franz

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/oncekit/oncekit/kafkamw"
	"github.com/twmb/franz-go/pkg/kgo"
)

// pollMax is how many records one poll takes from the client at most.
const pollMax = 500

type topicPartition struct {
	topic     string
	partition int32
}

// Reader is a kafkamw.Reader over a franz-go client in a consumer group.
// It owns the client (Client, Close).
type Reader struct {
	cl *kgo.Client

	mu  sync.Mutex
	buf []*kgo.Record
	// first is, for each partition assigned to this member now, the offset
	// of the first record fetched since it was assigned (-1: none yet).
	// A commit is sent only for a partition still assigned and for a
	// record fetched since: never one fetched under an earlier assignment,
	// which could move the group's offset back below what another member
	// committed meanwhile.
	first map[topicPartition]int64
}

// NewReader returns a Reader over a new franz-go client made with opts,
// which must name the seed brokers, the consumer group and the topics
// (kgo.SeedBrokers, kgo.ConsumerGroup, kgo.ConsumeTopics). The Reader adds
// kgo.DisableAutoCommit — the Consumer commits each offset once its
// message and every one before it are done — and its own
// OnPartitionsAssigned, OnPartitionsRevoked and OnPartitionsLost
// callbacks, which replace any in opts.
func NewReader(opts ...kgo.Opt) (*Reader, error) {
	r := &Reader{first: map[topicPartition]int64{}}
	all := append(append([]kgo.Opt{}, opts...),
		kgo.DisableAutoCommit(),
		kgo.OnPartitionsAssigned(r.assigned),
		kgo.OnPartitionsRevoked(r.revoked),
		kgo.OnPartitionsLost(r.revoked),
	)
	cl, err := kgo.NewClient(all...)
	if err != nil {
		return nil, fmt.Errorf("franz: %w", err)
	}
	if g, _ := cl.OptValue(kgo.ConsumerGroup).(string); g == "" {
		cl.Close()
		return nil, errors.New("franz: the client has no consumer group (kgo.ConsumerGroup): offsets can only be committed in a group")
	}
	r.cl = cl
	return r, nil
}

// GroupID is the client's consumer group: a kafkamw Consumer scopes keys
// by it (as it does KafkaGoReader's).
func (r *Reader) GroupID() string {
	g, _ := r.cl.OptValue(kgo.ConsumerGroup).(string)
	return g
}

// Client is the franz-go client (for its admin calls, metrics hooks...).
func (r *Reader) Client() *kgo.Client { return r.cl }

// Close leaves the group and closes the client.
func (r *Reader) Close() error {
	r.cl.Close()
	return nil
}

func (r *Reader) assigned(_ context.Context, _ *kgo.Client, parts map[string][]int32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for t, ps := range parts {
		for _, p := range ps {
			r.first[topicPartition{t, p}] = -1
		}
	}
}

// revoked forgets the partitions, and the records of them not yet handed
// out: their next owner reads them again.
func (r *Reader) revoked(_ context.Context, _ *kgo.Client, parts map[string][]int32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for t, ps := range parts {
		for _, p := range ps {
			delete(r.first, topicPartition{t, p})
		}
	}
	kept := r.buf[:0]
	for _, rec := range r.buf {
		if _, ok := r.first[topicPartition{rec.Topic, rec.Partition}]; ok {
			kept = append(kept, rec)
		}
	}
	clear(r.buf[len(kept):])
	r.buf = kept
}

// FetchMessage implements kafkamw.Reader: the next record, polling the
// client when none is buffered.
func (r *Reader) FetchMessage(ctx context.Context) (kafkamw.Message, error) {
	for {
		r.mu.Lock()
		for len(r.buf) > 0 {
			rec := r.buf[0]
			r.buf[0] = nil
			r.buf = r.buf[1:]
			tp := topicPartition{rec.Topic, rec.Partition}
			first, ok := r.first[tp]
			if !ok {
				continue // revoked since it was polled
			}
			if first < 0 {
				r.first[tp] = rec.Offset
			}
			r.mu.Unlock()
			return message(rec), nil
		}
		r.mu.Unlock()
		fs := r.cl.PollRecords(ctx, pollMax)
		if err := ctx.Err(); err != nil {
			return kafkamw.Message{}, err
		}
		if fs.IsClientClosed() {
			return kafkamw.Message{}, fmt.Errorf("franz: %w", kgo.ErrClientClosed)
		}
		var errs []error
		fs.EachError(func(t string, p int32, err error) {
			errs = append(errs, fmt.Errorf("%s/%d: %w", t, p, err))
		})
		if err := errors.Join(errs...); err != nil {
			return kafkamw.Message{}, fmt.Errorf("franz: fetch: %w", err)
		}
		r.mu.Lock()
		r.buf = append(r.buf, fs.Records()...)
		r.mu.Unlock()
	}
}

// CommitMessages implements kafkamw.Reader: it commits, per partition,
// the offset after the highest of msgs, for partitions still assigned and
// messages fetched since their assignment; the others are left out (a
// message left uncommitted is read again and found done).
func (r *Reader) CommitMessages(ctx context.Context, msgs ...kafkamw.Message) error {
	r.mu.Lock()
	recs := make([]*kgo.Record, 0, len(msgs))
	for _, m := range msgs {
		first, ok := r.first[topicPartition{m.Topic, int32(m.Partition)}]
		if !ok || first < 0 || m.Offset < first {
			continue
		}
		recs = append(recs, &kgo.Record{Topic: m.Topic, Partition: int32(m.Partition), Offset: m.Offset, LeaderEpoch: -1})
	}
	r.mu.Unlock()
	if len(recs) == 0 {
		return nil
	}
	if err := r.cl.CommitRecords(ctx, recs...); err != nil {
		return fmt.Errorf("franz: commit: %w", err)
	}
	return nil
}

func message(rec *kgo.Record) kafkamw.Message {
	hs := make([]kafkamw.Header, len(rec.Headers))
	for i, h := range rec.Headers {
		hs[i] = kafkamw.Header{Key: h.Key, Value: h.Value}
	}
	return kafkamw.Message{
		Topic: rec.Topic, Partition: int(rec.Partition), Offset: rec.Offset,
		Key: rec.Key, Value: rec.Value, Headers: hs, Time: rec.Timestamp,
	}
}

// Writer is a kafkamw.Writer (for a Producer, a dead-letter or a retry
// destination) over a franz-go client: each message is produced
// synchronously, to its Topic or the Writer's, to the partition the
// client's partitioner picks (by key by default, as kafka-go's Hash
// balancer).
type Writer struct {
	cl    *kgo.Client
	topic string
}

// NewWriter returns a Writer producing through cl; topic is the topic of
// messages that name none ("" when they all do).
func NewWriter(cl *kgo.Client, topic string) *Writer { return &Writer{cl: cl, topic: topic} }

// WriteMessages implements kafkamw.Writer.
func (w *Writer) WriteMessages(ctx context.Context, msgs ...kafkamw.Message) error {
	recs := make([]*kgo.Record, len(msgs))
	for i, m := range msgs {
		topic := m.Topic
		if topic == "" {
			topic = w.topic
		}
		if topic == "" {
			return fmt.Errorf("franz: message %d names no topic, and the Writer has none", i)
		}
		hs := make([]kgo.RecordHeader, len(m.Headers))
		for j, h := range m.Headers {
			hs[j] = kgo.RecordHeader{Key: h.Key, Value: h.Value}
		}
		recs[i] = &kgo.Record{Topic: topic, Key: m.Key, Value: m.Value, Headers: hs}
	}
	if err := w.cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		return fmt.Errorf("franz: produce: %w", err)
	}
	return nil
}
