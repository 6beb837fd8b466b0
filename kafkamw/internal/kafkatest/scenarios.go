package kafkatest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/kafkamw"
	"github.com/oncekit/oncekit/storage/memstore"
	"github.com/oncekit/oncekit/storage/redisstore"
	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"
)

// NewReaderFunc makes a group member of one Kafka client: the scenarios
// below run on kafka-go's Reader (KafkaGo) and on each adapter's.
type NewReaderFunc func(t testing.TB, brokers []string, topic, group string) kafkamw.Reader

// KafkaGo is NewReader as a NewReaderFunc.
func KafkaGo(t testing.TB, brokers []string, topic, group string) kafkamw.Reader {
	return kafkamw.KafkaGoReader(NewReader(t, brokers, topic, group))
}

// PartitionOrder: messages of one partition are handled in offset order, whatever the
// pipeline depth and concurrency.
func PartitionOrder(t *testing.T, newR NewReaderFunc) {
	brokers := testenv.KafkaBrokers(t)
	const partitions, n = 3, 1500
	topic := testenv.KafkaTopic(t, brokers, partitions)
	msgs := make([]kafka.Message, n)
	for i := range msgs {
		msgs[i] = Message(i)
	}
	Produce(t, NewWriter(t, brokers, topic), msgs)

	var mu sync.Mutex
	last := map[int]int64{}
	var disorder, running, maxRunning atomic.Int64
	var handled atomic.Int64
	c, err := kafkamw.NewConsumer(newR(t, brokers, topic, "g-"+topic), NewGuard(t, memstore.New()),
		func(ctx context.Context, m kafkamw.Message) error {
			r := running.Add(1)
			defer running.Add(-1)
			for old := maxRunning.Load(); r > old && !maxRunning.CompareAndSwap(old, r); old = maxRunning.Load() {
			}
			mu.Lock()
			if prev, ok := last[m.Partition]; ok && m.Offset <= prev {
				disorder.Add(1)
			}
			last[m.Partition] = m.Offset
			mu.Unlock()
			time.Sleep(100 * time.Microsecond)
			handled.Add(1)
			return nil
		}, kafkamw.WithConcurrency(8), kafkamw.WithPipeline(32))
	if err != nil {
		t.Fatal(err)
	}
	stop := Run(t, c)
	WaitFor(t, time.Minute, "every message", func() bool { return handled.Load() == n })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if d := disorder.Load(); d != 0 {
		t.Errorf("%d messages handled before an earlier one of their partition", d)
	}
	if m := maxRunning.Load(); m > partitions {
		t.Errorf("%d handlers ran at once with %d partitions", m, partitions)
	}
}

// Without a dead-letter destination a poison message stops the Consumer
// with a *PoisonError, and nothing from it on is committed.
func PoisonWithoutDeadLetterStops(t *testing.T, newR NewReaderFunc) {
	brokers := testenv.KafkaBrokers(t)
	topic := testenv.KafkaTopic(t, brokers, 1)
	msgs := make([]kafka.Message, 20)
	for i := range msgs {
		msgs[i] = Message(i)
	}
	Produce(t, NewWriter(t, brokers, topic), msgs)
	c, err := kafkamw.NewConsumer(newR(t, brokers, topic, "g-"+topic), NewGuard(t, memstore.New()),
		func(ctx context.Context, m kafkamw.Message) error {
			if IDOf(m) == "m-7" {
				return errors.New("boom")
			}
			return nil
		}, kafkamw.WithRetry(2, time.Millisecond, time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = c.Run(ctx)
	var pe *kafkamw.PoisonError
	if !errors.As(err, &pe) || pe.Offset != 7 || pe.Partition != 0 || pe.Topic != topic {
		t.Fatalf("Run: %v, want a *PoisonError for offset 7", err)
	}
	if got := Committed(t, brokers, topic, "g-"+topic, 1)[0]; got != 7 {
		t.Errorf("committed offset %d, want 7 (up to the poison message, not past it)", got)
	}
	if u := c.Uncommitted()[topic][0]; u < 1 || u > 13 {
		t.Errorf("%d messages uncommitted: want the poison message and at most the 12 behind it", u)
	}
}

// StoreAway: the store going away (its server paused) stops the handlers' completions
// and so the commits; when it is back, the consumer goes on, and every
// effect happened once.
func StoreAway(t *testing.T, newR NewReaderFunc) {
	brokers := testenv.KafkaBrokers(t)
	srv := testenv.StartRedis(t)
	const unique = 600
	topic := testenv.KafkaTopic(t, brokers, 2)
	msgs, want := Messages(unique, 0)
	Produce(t, NewWriter(t, brokers, topic), msgs)

	client := redis.NewClient(&redis.Options{Addr: srv.Addr, ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond})
	defer client.Close()
	st, err := redisstore.New(client)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	const effects = "effects"
	handler := CountHandler(effects, time.Millisecond)
	c, err := kafkamw.NewConsumer(newR(t, brokers, topic, "g-"+topic), NewGuard(t, st),
		func(ctx context.Context, m kafkamw.Message) error {
			time.Sleep(time.Millisecond)
			return handler(ctx, m)
		})
	if err != nil {
		t.Fatal(err)
	}
	stop := Run(t, c)
	WaitFor(t, time.Minute, "progress", func() bool { return c.Stats().Handled >= 100 })
	srv.Pause()
	time.Sleep(300 * time.Millisecond) // what was done before the pause commits
	commits := c.Stats().Commits
	before := Committed(t, brokers, topic, "g-"+topic, 2)
	WaitFor(t, 30*time.Second, "store errors", func() bool { return c.Stats().StoreErrors > 0 })
	time.Sleep(time.Second)
	if got := c.Stats().Commits; got != commits {
		t.Errorf("%d commits while the store was away", got-commits)
	}
	if after := Committed(t, brokers, topic, "g-"+topic, 2); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("committed offsets moved from %v to %v while the store was away", before, after)
	}
	srv.Resume()
	check := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer check.Close()
	WaitFor(t, time.Minute, "every message", func() bool {
		n, _ := check.HLen(context.Background(), effects).Result()
		return n == unique
	})
	WaitFor(t, 30*time.Second, "every offset committed", func() bool { return AllCommitted(t, brokers, topic, "g-"+topic, 2) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	CheckCounts(t, check, effects, want)
	t.Logf("%+v", c.Stats())
}

// The child consumer process of KilledConsumer reads these.
const (
	childEnv        = "KAFKAMW_TEST_CHILD"
	childBrokersEnv = "KAFKAMW_TEST_BROKERS"
	childTopicEnv   = "KAFKAMW_TEST_TOPIC"
	childRedisEnv   = "KAFKAMW_TEST_REDIS"
	childPrefixEnv  = "KAFKAMW_TEST_PREFIX"
)

// countOnce is the handler's effect: it counts the message in a Redis hash,
// committed with the message's idempotency record in one script.
var countOnce = redisstore.NewEffectScript(`redis.call('HINCRBY', KEYS[1], ARGV[1], 1)`)

// CountHandler counts each message in the Redis hash at effectsKey,
// committed with its idempotency record, after work.
func CountHandler(effectsKey string, work time.Duration) kafkamw.Handler {
	return func(ctx context.Context, m kafkamw.Message) error {
		time.Sleep(work) // so that a kill lands mid-stream
		return idem.Commit(ctx, redisstore.Effect{Script: countOnce, Keys: []string{effectsKey}, Args: []any{IDOf(m)}})
	}
}

// runChild is a consumer process: it handles the topic until it is killed,
// or stops gracefully on SIGTERM.

// RunChild makes this process a child consumer of KilledConsumer when the
// environment says so (it then exits), reading through open; a test
// binary's TestMain calls it first.
func RunChild(open func(brokers []string, topic, group string) (kafkamw.Reader, io.Closer, error)) {
	if os.Getenv(childEnv) == "" {
		return
	}
	err := func() error {
		client := redis.NewClient(&redis.Options{Addr: os.Getenv(childRedisEnv)})
		defer client.Close()
		prefix := os.Getenv(childPrefixEnv)
		st, err := redisstore.New(client, redisstore.WithRecordPrefix(prefix))
		if err != nil {
			return err
		}
		defer st.Close()
		g, err := idem.NewGuard(st, idem.WithTTL(time.Second))
		if err != nil {
			return err
		}
		topic := os.Getenv(childTopicEnv)
		r, closer, err := open([]string{os.Getenv(childBrokersEnv)}, topic, "g-"+topic)
		if err != nil {
			return err
		}
		defer closer.Close()
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
		defer stop()
		c, err := kafkamw.NewConsumer(r, g, CountHandler(prefix+"effects", 2*time.Millisecond), kafkamw.WithConcurrency(4))
		if err != nil {
			return err
		}
		fmt.Println("ready")
		go func() {
			<-ctx.Done()
			_ = c.Shutdown(context.Background())
		}()
		return c.Run(context.Background())
	}()
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(3)
	}
	os.Exit(0)
}

// KilledConsumer: a consumer process (this test binary, whose TestMain
// calls RunChild) killed with SIGKILL mid-stream, again and again, and
// restarted: every message's effect happens exactly once and none is lost.
func KilledConsumer(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	addr := testenv.RedisAddrs(t, 1)[0]
	const partitions, unique, dups, kills = 4, 2500, 500, 4
	topic := testenv.KafkaTopic(t, brokers, partitions)
	msgs, want := Messages(unique, dups)
	Produce(t, NewWriter(t, brokers, topic), msgs)

	prefix := fmt.Sprintf("kafkamw-kill:%d:", time.Now().UnixNano())
	client := redis.NewClient(&redis.Options{Addr: addr})
	defer client.Close()
	start := func() *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), childEnv+"=1", childBrokersEnv+"="+brokers[0], childTopicEnv+"="+topic,
			childRedisEnv+"="+addr, childPrefixEnv+"="+prefix)
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if line, err := bufio.NewReader(out).ReadString('\n'); line != "ready\n" {
			t.Fatalf("child said %q (%v)", line, err)
		}
		return cmd
	}
	done := func() int64 { n, _ := client.HLen(context.Background(), prefix+"effects").Result(); return n }
	for i := range kills {
		cmd := start()
		before := done()
		// Kill once it has made progress, at a random moment after.
		WaitFor(t, time.Minute, "the child to make progress", func() bool { return done() > before || done() == unique })
		time.Sleep(time.Duration(rand.N(200)) * time.Millisecond)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Logf("kill %d: %d of %d messages done", i+1, done(), unique)
	}
	cmd := start()
	WaitFor(t, 2*time.Minute, "every message", func() bool { return done() == unique })
	WaitFor(t, 30*time.Second, "every offset committed", func() bool { return AllCommitted(t, brokers, topic, "g-"+topic, partitions) })
	_ = cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Errorf("last child: %v", err)
	}
	CheckCounts(t, client, prefix+"effects", want)
}

// CheckCounts fails unless the hash at key counts each of want once.
func CheckCounts(t *testing.T, client *redis.Client, key string, want map[string]bool) {
	t.Helper()
	got, err := client.HGetAll(context.Background(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	bad := 0
	for id := range want {
		if got[id] != "1" && bad < 10 {
			t.Errorf("%s: effect ran %q times, want 1", id, got[id])
			bad++
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d distinct effects, want %d", len(got), len(want))
	}
}
