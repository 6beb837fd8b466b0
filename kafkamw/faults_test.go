package kafkamw_test

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"
	"go.uber.org/goleak"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/kafkamw"
	"github.com/oncekit/oncekit/kafkamw/franz"
	"github.com/oncekit/oncekit/kafkamw/kafkamwtest"
	"github.com/oncekit/oncekit/storage/redisstore"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		runChild()
		return
	}
	goleak.VerifyTestMain(m)
}

// The child consumer process of TestKilledConsumer reads these.
const (
	childEnv        = "KAFKAMW_TEST_CHILD"
	childBrokersEnv = "KAFKAMW_TEST_BROKERS"
	childTopicEnv   = "KAFKAMW_TEST_TOPIC"
	childRedisEnv   = "KAFKAMW_TEST_REDIS"
	childPrefixEnv  = "KAFKAMW_TEST_PREFIX"
	childClientEnv  = "KAFKAMW_TEST_CLIENT" // "franz-go" or kafka-go's
)

// countOnce is the handler's effect: it counts the message in a Redis hash,
// committed with the message's idempotency record in one script.
var countOnce = redisstore.NewEffectScript(`redis.call('HINCRBY', KEYS[1], ARGV[1], 1)`)

func countHandler(effectsKey string, work time.Duration) kafkamw.Handler {
	return func(ctx context.Context, m kafka.Message) error {
		time.Sleep(work) // so that a kill lands mid-stream
		return idem.Commit(ctx, redisstore.Effect{Script: countOnce, Keys: []string{effectsKey}, Args: []any{idOf(m)}})
	}
}

// runChild is a consumer process: it handles the topic until it is killed,
// or stops gracefully on SIGTERM.
func runChild() {
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
		var r interface {
			kafkamw.Reader
			Close() error
		}
		if os.Getenv(childClientEnv) == "franz-go" {
			fr, err := franz.NewReader(franzReaderOpts([]string{os.Getenv(childBrokersEnv)}, topic, "g-"+topic)...)
			if err != nil {
				return err
			}
			r = fr
		} else {
			r = kafka.NewReader(readerConfig([]string{os.Getenv(childBrokersEnv)}, topic, "g-"+topic))
		}
		defer r.Close()
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
		defer stop()
		c, err := kafkamw.NewConsumer(r, g, countHandler(prefix+"effects", 2*time.Millisecond), kafkamw.WithConcurrency(4))
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

// A consumer process killed with SIGKILL mid-stream, again and again, and
// restarted: every message's effect happens exactly once and none is lost,
// on kafka-go's Reader and on franz-go's.
func TestKilledConsumer(t *testing.T) {
	t.Parallel() // (topics, groups and store of its own)
	for _, client := range []string{"kafka-go", "franz-go"} {
		t.Run(client, func(t *testing.T) { t.Parallel(); killedConsumer(t, client) })
	}
}

func killedConsumer(t *testing.T, kind string) {
	brokers := kafkamwtest.Brokers(t)
	addr := testenv.RedisAddrs(t, 1)[0]
	const partitions, unique, dups, kills = 4, 2500, 500, 4
	topic := kafkamwtest.Topic(t, brokers, partitions)
	msgs, want := messages(unique, dups)
	produce(t, newWriter(t, brokers, topic), msgs)

	prefix := fmt.Sprintf("kafkamw-kill:%d:", time.Now().UnixNano())
	client := redis.NewClient(&redis.Options{Addr: addr})
	defer client.Close()
	start := func() *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), childEnv+"=1", childBrokersEnv+"="+brokers[0], childTopicEnv+"="+topic,
			childRedisEnv+"="+addr, childPrefixEnv+"="+prefix, childClientEnv+"="+kind)
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
		waitFor(t, time.Minute, "the child to make progress", func() bool { return done() > before || done() == unique })
		time.Sleep(time.Duration(rand.N(200)) * time.Millisecond)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Logf("kill %d: %d of %d messages done", i+1, done(), unique)
	}
	cmd := start()
	waitFor(t, 2*time.Minute, "every message", func() bool { return done() == unique })
	waitFor(t, 30*time.Second, "every offset committed", func() bool { return allCommitted(t, brokers, topic, "g-"+topic, partitions) })
	_ = cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Errorf("last child: %v", err)
	}
	checkCounts(t, client, prefix+"effects", want)
}

func checkCounts(t *testing.T, client *redis.Client, key string, want map[string]bool) {
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

// Two consumers in one group: the second joins mid-stream and the first
// leaves mid-stream, two rebalances; each message's handler still runs once.
func TestRebalance(t *testing.T) {
	brokers := kafkamwtest.Brokers(t)
	const partitions, unique, dups = 4, 4000, 400
	topic := kafkamwtest.Topic(t, brokers, partitions)
	msgs, want := messages(unique, dups)
	produce(t, newWriter(t, brokers, topic), msgs)

	st := newRedisStore(t, testenv.RedisAddrs(t, 1)[0])
	eff := newEffects()
	handler := func(ctx context.Context, m kafka.Message) error {
		time.Sleep(300 * time.Microsecond)
		eff.add(idOf(m))
		return nil
	}
	group := "g-" + topic
	newConsumer := func() (*kafkamw.Consumer, *kafka.Reader) {
		r := newReader(t, brokers, topic, group)
		c, err := kafkamw.NewConsumer(r, newGuard(t, st), handler, kafkamw.WithConcurrency(2))
		if err != nil {
			t.Fatal(err)
		}
		return c, r
	}
	a, readerA := newConsumer()
	stopA := run(t, a)
	waitFor(t, time.Minute, "the first consumer to start", func() bool { return eff.distinct() >= 500 })
	b, _ := newConsumer()
	stopB := run(t, b)
	waitFor(t, time.Minute, "the second consumer to take partitions", func() bool { return b.Stats().Fetched > 0 })
	waitFor(t, time.Minute, "progress", func() bool { return eff.distinct() >= 2500 })
	if err := stopA(); err != nil {
		t.Fatalf("first consumer: %v", err)
	}
	readerA.Close() // leaves the group: the second consumer takes every partition
	waitFor(t, 2*time.Minute, "every message", func() bool { return eff.distinct() == unique })
	waitFor(t, 30*time.Second, "every offset committed", func() bool { return allCommitted(t, brokers, topic, group, partitions) })
	if err := stopB(); err != nil {
		t.Fatalf("second consumer: %v", err)
	}
	eff.check(t, want)
	t.Logf("first %+v", a.Stats())
	t.Logf("second %+v", b.Stats())
}

// The store going away (its server paused) stops the handlers' completions
// and so the commits; when it is back, the consumer goes on, and every
// effect happened once. On kafka-go's Reader and on franz-go's.
func TestStoreAway(t *testing.T) {
	t.Parallel() // (topics and a store of its own)
	eachReader(t, storeAway)
}

func storeAway(t *testing.T, newR newReaderFunc) {
	brokers := kafkamwtest.Brokers(t)
	srv := testenv.StartRedis(t)
	const unique = 600
	topic := kafkamwtest.Topic(t, brokers, 2)
	msgs, want := messages(unique, 0)
	produce(t, newWriter(t, brokers, topic), msgs)

	client := redis.NewClient(&redis.Options{Addr: srv.Addr, ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond})
	defer client.Close()
	st, err := redisstore.New(client)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	const effects = "effects"
	handler := countHandler(effects, time.Millisecond)
	c, err := kafkamw.NewConsumer(newR(t, brokers, topic, "g-"+topic), newGuard(t, st),
		func(ctx context.Context, m kafka.Message) error {
			time.Sleep(time.Millisecond)
			return handler(ctx, m)
		})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	waitFor(t, time.Minute, "progress", func() bool { return c.Stats().Handled >= 100 })
	srv.Pause()
	time.Sleep(300 * time.Millisecond) // what was done before the pause commits
	commits := c.Stats().Commits
	before := committed(t, brokers, topic, "g-"+topic, 2)
	waitFor(t, 30*time.Second, "store errors", func() bool { return c.Stats().StoreErrors > 0 })
	time.Sleep(time.Second)
	if got := c.Stats().Commits; got != commits {
		t.Errorf("%d commits while the store was away", got-commits)
	}
	if after := committed(t, brokers, topic, "g-"+topic, 2); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("committed offsets moved from %v to %v while the store was away", before, after)
	}
	srv.Resume()
	check := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer check.Close()
	waitFor(t, time.Minute, "every message", func() bool {
		n, _ := check.HLen(context.Background(), effects).Result()
		return n == unique
	})
	waitFor(t, 30*time.Second, "every offset committed", func() bool { return allCommitted(t, brokers, topic, "g-"+topic, 2) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	checkCounts(t, check, effects, want)
	t.Logf("%+v", c.Stats())
}
