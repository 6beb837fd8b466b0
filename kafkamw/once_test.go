package kafkamw_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/kafkamw"
	"github.com/oncekit/oncekit/kafkamw/internal/kafkatest"
	"github.com/oncekit/oncekit/storage/memstore"
)

// A handler error that wraps a replayed final error (the handler called a
// Guard of its own, which replayed one) is the handler's error: retried,
// not taken for a duplicate and committed with no effect.
func TestHandlerErrorWrappingReplayedIsRetried(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	topic := testenv.KafkaTopic(t, brokers, 1)
	produce(t, newWriter(t, brokers, topic), []kafka.Message{message(0), message(1)})
	replayedErr := replayedFinalError(t)
	var calls atomic.Int64
	eff := newEffects()
	c, err := kafkamw.NewConsumer(kafkamw.KafkaGoReader(newReader(t, brokers, topic, "g-"+topic)), newGuard(t, memstore.New()),
		func(ctx context.Context, m kafkamw.Message) error {
			if idOf(m) == "m-0" && calls.Add(1) == 1 {
				return fmt.Errorf("downstream: %w", replayedErr)
			}
			eff.Add(idOf(m))
			return nil
		}, kafkamw.WithRetry(3, time.Millisecond, 10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	waitFor(t, 30*time.Second, "both messages done", func() bool { s := c.Stats(); return s.Handled+s.Duplicates == 2 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	eff.Check(t, map[string]bool{"m-0": true, "m-1": true})
	if s := c.Stats(); s.Handled != 2 || s.Duplicates != 0 || s.Retries != 1 {
		t.Errorf("stats %+v, want 2 handled, 1 retry, no duplicate", s)
	}
}

// rewind sets group's committed offset of topic's partition 0 to offset;
// the group must have no member.
func rewind(t *testing.T, brokers []string, topic, group string, offset int64) {
	t.Helper()
	c, done := kafkatest.Admin(t, brokers)
	defer done()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		res, err := c.OffsetCommit(ctx, &kafka.OffsetCommitRequest{
			GroupID: group, GenerationID: -1,
			Topics: map[string][]kafka.OffsetCommit{topic: {{Partition: 0, Offset: offset}}},
		})
		if err == nil {
			if err = res.Topics[topic][0].Error; err == nil {
				return
			}
		}
		if ctx.Err() != nil { // the group may still be rebalancing away its last member
			t.Fatalf("rewind %s to %d: %v", group, offset, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A message rejected for its key (malformed, or reused with another
// payload) and dead-lettered is not dead-lettered again when it is
// delivered again: the rejection is recorded. Here the group's offset is
// moved back to 0 after a first consumer handled everything, and a second
// consumer of the group reads it all again.
func TestRejectionRecorded(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	topic := testenv.KafkaTopic(t, brokers, 1)
	dlqTopic := testenv.KafkaTopic(t, brokers, 1)
	group := "g-" + topic
	bad := kafka.Message{Key: []byte("x"), Value: []byte("v"), Headers: []kafka.Header{{Key: kafkamw.DefaultKeyHeader, Value: []byte("has space")}}}
	reused := message(1)
	reused.Value = []byte("another payload")
	produce(t, newWriter(t, brokers, topic), []kafka.Message{message(0), bad, message(1), reused})
	store := memstore.New()
	dlq := newWriter(t, brokers, dlqTopic)
	consume := func() kafkamw.Stats {
		r := kafka.NewReader(kafkatest.ReaderConfig(brokers, topic, group))
		c, err := kafkamw.NewConsumer(kafkamw.KafkaGoReader(r), newGuard(t, store),
			func(ctx context.Context, m kafkamw.Message) error { return nil },
			kafkamw.WithDeadLetter(kafkamw.KafkaGoWriter(dlq), ""))
		if err != nil {
			t.Fatal(err)
		}
		stop := run(t, c)
		waitFor(t, time.Minute, "all four messages", func() bool {
			s := c.Stats()
			return s.Handled+s.Duplicates+s.DeadLettered == 4
		})
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		_ = r.Close() // leaves the group
		return c.Stats()
	}
	if s := consume(); s.Handled != 2 || s.DeadLettered != 2 {
		t.Fatalf("first delivery: stats %+v, want 2 handled, 2 dead-lettered", s)
	}
	rewind(t, brokers, topic, group, 0)
	if s := consume(); s.Duplicates != 4 || s.DeadLettered != 0 {
		t.Errorf("redelivery: stats %+v, want 4 duplicates and nothing dead-lettered again", s)
	}
	if n := ends(t, brokers, dlqTopic, 1)[0]; n != 2 {
		t.Errorf("%d dead letters, want 2", n)
	}
}

// swapReader is a Reader whose kafka.Reader the test replaces mid-run:
// the first leaves the group (pause), the group's offset moves on, and a
// second joins it (resume) — the partition is assigned anew, from wherever
// the group's offset is then. A fetch waiting on the first when it is
// paused waits for the second. It records the offsets committed through
// each reader.
type swapReader struct {
	mu      sync.Mutex
	r       *kafka.Reader
	ready   chan struct{} // closed while r is set
	stop    context.CancelFunc
	commits map[*kafka.Reader][]int64
}

func newSwapReader(r *kafka.Reader) *swapReader {
	ready := make(chan struct{})
	close(ready)
	return &swapReader{r: r, ready: ready, commits: map[*kafka.Reader][]int64{}}
}

func (s *swapReader) FetchMessage(ctx context.Context) (kafkamw.Message, error) {
	for {
		s.mu.Lock()
		r, ready := s.r, s.ready
		fctx, cancel := context.WithCancel(ctx)
		s.stop = cancel
		s.mu.Unlock()
		if r == nil {
			cancel()
			select {
			case <-ready:
				continue
			case <-ctx.Done():
				return kafkamw.Message{}, ctx.Err()
			}
		}
		m, err := kafkamw.KafkaGoReader(r).FetchMessage(fctx)
		cancel()
		if err != nil && ctx.Err() == nil && fctx.Err() != nil {
			continue // paused: fetch from the next reader
		}
		return m, err
	}
}

func (s *swapReader) CommitMessages(ctx context.Context, msgs ...kafkamw.Message) error {
	s.mu.Lock()
	r := s.r
	s.mu.Unlock()
	if r == nil {
		return errors.New("no reader: between assignments")
	}
	// Recorded by reader, not by time: a commit through the first reader
	// may return after the swap although the broker had it before.
	err := kafkamw.KafkaGoReader(r).CommitMessages(ctx, msgs...)
	if err == nil {
		s.mu.Lock()
		for _, m := range msgs {
			s.commits[r] = append(s.commits[r], m.Offset)
		}
		s.mu.Unlock()
	}
	return err
}

// pause takes the reader away and returns it.
func (s *swapReader) pause() *kafka.Reader {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.r
	s.r, s.ready = nil, make(chan struct{})
	if s.stop != nil {
		s.stop()
	}
	return old
}

// resume fetches and commits through r from now on.
func (s *swapReader) resume(r *kafka.Reader) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.r = r
	close(s.ready)
}

// A partition assigned anew that resumes at a higher offset (another member
// committed meanwhile) must not have its group offset moved back by the
// messages still in flight here from its earlier assignment.
func TestPartitionBackAtHigherOffsetNeverCommitsBelow(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	topic := testenv.KafkaTopic(t, brokers, 1)
	group := "g-" + topic
	const n, fetched, jump = 20, 7, 10
	msgs := make([]kafka.Message, n)
	for i := range msgs {
		msgs[i] = message(i)
	}
	w := newWriter(t, brokers, topic)
	produce(t, w, msgs[:fetched])
	sr := newSwapReader(kafka.NewReader(kafkatest.ReaderConfig(brokers, topic, group)))
	blocked, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	c, err := kafkamw.NewConsumer(sr, newGuard(t, memstore.New()),
		func(ctx context.Context, m kafkamw.Message) error {
			if m.Offset == 3 {
				close(blocked)
				select {
				case <-release:
				case <-ctx.Done():
				}
			}
			return nil
		}, kafkamw.WithGroup(group), kafkamw.WithPipeline(8))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	t.Cleanup(unblock) // runs before stop's cleanup
	<-blocked          // offsets 0–2 done, 3 in its handler, 4–6 waiting behind it
	waitFor(t, 30*time.Second, "offsets 0–2 committed and 0–6 fetched", func() bool {
		return committed(t, brokers, topic, group, 1)[0] == 3 && c.Stats().Fetched == fetched
	})
	// The partition goes away, another member commits up to 10, and the
	// partition comes back here: the next fetch is offset 10.
	_ = sr.pause().Close()
	rewind(t, brokers, topic, group, jump)
	produce(t, w, msgs[fetched:])
	second := kafka.NewReader(kafkatest.ReaderConfig(brokers, topic, group))
	t.Cleanup(func() { second.Close() })
	sr.resume(second)
	waitFor(t, 30*time.Second, "offset 10 fetched", func() bool { return c.Stats().Fetched > fetched })
	unblock()
	waitFor(t, time.Minute, "every message", func() bool { return committed(t, brokers, topic, group, 1)[0] == n })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	sr.mu.Lock()
	defer sr.mu.Unlock()
	after := sr.commits[second]
	for _, off := range after {
		if off < jump {
			t.Errorf("after the partition came back at %d, offset %d was committed (commits %v): the group's offset moved back",
				jump, off, after)
			break
		}
	}
}

// replayedFinalError is what a Guard's duplicate gets after a run failed
// with a final error: the stored error, replayed.
func replayedFinalError(t *testing.T) error {
	g := newGuard(t, memstore.New(), idem.WithFinalErrors(func(error) bool { return true }))
	fail := func(context.Context) ([]byte, error) { return nil, errors.New("an earlier failure") }
	_, _, _ = g.Do(t.Context(), "downstream", "fp", fail)
	_, replayed, err := g.Do(t.Context(), "downstream", "fp", fail)
	if !replayed || err == nil {
		t.Fatalf("the duplicate: replayed=%v err=%v, want a replayed error", replayed, err)
	}
	return err
}
