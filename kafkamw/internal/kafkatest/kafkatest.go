package kafkatest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/kafkamw"
	"github.com/oncekit/oncekit/storage/memstore"
	"github.com/oncekit/oncekit/storage/redisstore"
)

var Stores = []struct {
	Name string
	New  func(t testing.TB) idemdriver.Store
}{
	{"memory", func(testing.TB) idemdriver.Store { return memstore.New() }},
	{"redis", func(t testing.TB) idemdriver.Store { return NewRedisStore(t, testenv.RedisAddrs(t, 1)[0]) }},
}

func NewRedisStore(t testing.TB, addr string) *redisstore.Store {
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { c.Close() })
	s, err := redisstore.New(c, redisstore.WithRecordPrefix(fmt.Sprintf("kafkamw-test:%d:", time.Now().UnixNano())))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func EachStore(t *testing.T, f func(t *testing.T, st idemdriver.Store)) {
	for _, s := range Stores {
		t.Run(s.Name, func(t *testing.T) { f(t, s.New(t)) })
	}
}

func NewGuard(t testing.TB, st idemdriver.Store, opts ...idem.Option) *idem.Guard {
	g, err := idem.NewGuard(st, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// NewReader is a group member with short timeouts, so that rebalances in
// tests take milliseconds, not kafka-go's default 30 s session.
func NewReader(t testing.TB, brokers []string, topic, group string) *kafka.Reader {
	r := kafka.NewReader(ReaderConfig(brokers, topic, group))
	t.Cleanup(func() { r.Close() })
	return r
}

func ReaderConfig(brokers []string, topic, group string) kafka.ReaderConfig {
	return kafka.ReaderConfig{
		Brokers:           brokers,
		Topic:             topic,
		GroupID:           group,
		StartOffset:       kafka.FirstOffset,
		MinBytes:          1,
		MaxBytes:          10 << 20,
		MaxWait:           50 * time.Millisecond,
		HeartbeatInterval: 100 * time.Millisecond,
		SessionTimeout:    1 * time.Second,
		RebalanceTimeout:  1 * time.Second,
		JoinGroupBackoff:  100 * time.Millisecond,
		ReadBackoffMin:    10 * time.Millisecond,
		ReadBackoffMax:    100 * time.Millisecond,
	}
}

func NewWriter(t testing.TB, brokers []string, topic string) *kafka.Writer {
	tr := &kafka.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	w := &kafka.Writer{
		Addr:         kafka.TCP(brokers...),
		Topic:        topic,
		Balancer:     &kafka.Hash{},
		BatchTimeout: 2 * time.Millisecond,
		BatchSize:    1000,
		RequiredAcks: kafka.RequireAll,
		Transport:    tr,
	}
	t.Cleanup(func() { w.Close() })
	return w
}

// Message is logical message i: key and payload derive from i, so a
// duplicate (the same i) is the same message.
func Message(i int) kafka.Message {
	id := "m-" + strconv.Itoa(i)
	return kafka.Message{
		Key:     []byte(id),
		Value:   []byte("payload " + id),
		Headers: []kafka.Header{{Key: kafkamw.DefaultKeyHeader, Value: []byte(id)}},
	}
}

// Messages returns logical messages 0 to unique-1, then dups duplicates of
// random ones among them, and the ids whose effect must happen once each.
func Messages(unique, dups int) ([]kafka.Message, map[string]bool) {
	msgs := make([]kafka.Message, 0, unique+dups)
	want := make(map[string]bool, unique)
	for i := range unique {
		msgs = append(msgs, Message(i))
		want["m-"+strconv.Itoa(i)] = true
	}
	for range dups {
		msgs = append(msgs, Message(rand.N(unique)))
	}
	return msgs, want
}

func Produce(t testing.TB, w *kafka.Writer, msgs []kafka.Message) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for len(msgs) > 0 {
		n := min(len(msgs), 1000)
		if err := w.WriteMessages(ctx, msgs[:n]...); err != nil {
			t.Fatal(err)
		}
		msgs = msgs[n:]
	}
}

// Effects counts the handler's runs per message ID.
type Effects struct {
	mu  sync.Mutex
	ran map[string]int
}

func NewEffects() *Effects { return &Effects{ran: make(map[string]int)} }

func (e *Effects) Add(id string) {
	e.mu.Lock()
	e.ran[id]++
	e.mu.Unlock()
}

func (e *Effects) Distinct() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.ran)
}

// check fails unless every one of want ran exactly once, and nothing else.
func (e *Effects) Check(t *testing.T, want map[string]bool) {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	bad := 0
	for id := range want {
		if n := e.ran[id]; n != 1 && bad < 10 {
			t.Errorf("%s ran %d times, want 1", id, n)
			bad++
		}
	}
	for id, n := range e.ran {
		if !want[id] {
			t.Errorf("%s ran %d times, want 0", id, n)
		}
	}
}

func IDOf(m kafkamw.Message) string { return string(m.Key) }

// WaitFor polls cond until it holds or the deadline passes.
func WaitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Admin is a client of the broker at brokers[0]; close it after use.
func Admin(t *testing.T, brokers []string) (c *kafka.Client, close func()) {
	t.Helper()
	addr, err := net.ResolveTCPAddr("tcp", brokers[0])
	if err != nil {
		t.Fatal(err)
	}
	tr := &kafka.Transport{}
	return &kafka.Client{Addr: addr, Transport: tr}, tr.CloseIdleConnections
}

// Committed returns the group's committed offset of each partition of
// topic (-1: none).
func Committed(t *testing.T, brokers []string, topic, group string, partitions int) []int64 {
	t.Helper()
	c, done := Admin(t, brokers)
	defer done()
	ids := make([]int, partitions)
	for i := range ids {
		ids[i] = i
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := c.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: ids}})
	if err != nil {
		t.Fatal(err)
	}
	out := make([]int64, partitions)
	for _, p := range res.Topics[topic] {
		if p.Error != nil {
			t.Fatal(p.Error)
		}
		out[p.Partition] = p.CommittedOffset
	}
	return out
}

// Ends returns each partition's end offset (the offset of the next message).
func Ends(t *testing.T, brokers []string, topic string, partitions int) []int64 {
	t.Helper()
	c, done := Admin(t, brokers)
	defer done()
	reqs := make([]kafka.OffsetRequest, partitions)
	for i := range reqs {
		reqs[i] = kafka.LastOffsetOf(i)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := c.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: reqs}})
	if err != nil {
		t.Fatal(err)
	}
	out := make([]int64, partitions)
	for _, p := range res.Topics[topic] {
		if p.Error != nil {
			t.Fatal(p.Error)
		}
		out[p.Partition] = p.LastOffset
	}
	return out
}

// AllCommitted reports whether the group has committed every partition of
// topic up to its end.
func AllCommitted(t *testing.T, brokers []string, topic, group string, partitions int) bool {
	t.Helper()
	return slices.Equal(Committed(t, brokers, topic, group, partitions), Ends(t, brokers, topic, partitions))
}

// Run starts c.Run and returns a function that shuts it down and returns
// Run's error.
func Run(t *testing.T, c *kafkamw.Consumer) (stop func() error) {
	errc := make(chan error, 1)
	go func() { errc <- c.Run(context.Background()) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if serr := c.Shutdown(ctx); serr != nil {
				t.Errorf("Shutdown: %v", serr)
			}
			err = <-errc
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

// DeadLetter reads the next message of the dead-letter topic and its
// dead-letter headers by name, the default prefix removed.
func DeadLetter(t *testing.T, r *kafka.Reader) (kafka.Message, map[string]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	m, err := r.ReadMessage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	h := map[string]string{}
	for _, hd := range m.Headers {
		if name, ok := strings.CutPrefix(hd.Key, kafkamw.DefaultDeadLetterPrefix); ok {
			h[name] = string(hd.Value)
		}
	}
	return m, h
}

// Kafkamw returns msgs as kafkamw's Messages (what a Producer sends).
func Kafkamw(msgs []kafka.Message) []kafkamw.Message {
	out := make([]kafkamw.Message, len(msgs))
	for i, m := range msgs {
		hs := make([]kafkamw.Header, len(m.Headers))
		for j, h := range m.Headers {
			hs[j] = kafkamw.Header{Key: h.Key, Value: h.Value}
		}
		out[i] = kafkamw.Message{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset, Key: m.Key, Value: m.Value, Headers: hs, Time: m.Time}
	}
	return out
}
