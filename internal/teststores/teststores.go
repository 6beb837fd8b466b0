package teststores

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/storage"
	"github.com/oncekit/oncekit/storage/memstore"
	"github.com/oncekit/oncekit/storage/redisstore"
	"github.com/oncekit/oncekit/storage/redlockstore"

	_ "github.com/oncekit/oncekit/storage/all"
)

// Store is what every oncekit driver is.
type Store interface {
	lock.Locker
	idemdriver.Store
}

// Config is one store configuration: Open gives a store of its own,
// closed when the test ends. Two Opens of the memory, Redis and Redlock
// configurations do not share keys (a store, or a key prefix, each): a
// test that needs replicas on one store shares one Open. The other
// configurations share their servers' keys: a test names its keys apart
// (Name).
type Config struct {
	Name   string
	Fenced bool // whether its leases carry fences
	Open   func(t testing.TB) Store
}

// All is every configuration, memory first.
func All() []Config {
	return []Config{
		{"memory", true, func(t testing.TB) Store { s := memstore.New(); t.Cleanup(func() { s.Close() }); return s }},
		{"redis", true, func(t testing.TB) Store { return redisStore(t) }},
		{"redis-unfenced", false, func(t testing.TB) Store { return redisStore(t, redisstore.WithoutFencing()) }},
		{"redis-sentinel", true, func(t testing.TB) Store {
			sentinels, master := testenv.SentinelAddrs(t)
			return open(t, "redis-sentinel://"+strings.Join(sentinels, ",")+"?master_name="+master)
		}},
		{"redis-cluster", true, func(t testing.TB) Store {
			return open(t, "redis-cluster://"+strings.Join(testenv.RedisClusterAddrs(t), ","))
		}},
		{"redlock", true, func(t testing.TB) Store { return redlockStore(t) }},
		{"redlock-unfenced", false, func(t testing.TB) Store { return redlockStore(t, redlockstore.WithoutFencing()) }},
		{"etcd", true, func(t testing.TB) Store { return open(t, "etcd://"+strings.Join(testenv.EtcdAddrs(t), ",")) }},
		{"postgres", true, func(t testing.TB) Store { return open(t, testenv.PostgresURL(t)) }},
		{"mysql", true, func(t testing.TB) Store { return open(t, testenv.MySQLURL(t)) }},
		{"zk", true, func(t testing.TB) Store { return open(t, "zk://"+strings.Join(testenv.ZooKeeperAddrs(t), ",")) }},
	}
}

// Each runs f on every configuration, as subtests.
func Each(t *testing.T, f func(t *testing.T, c Config)) {
	for _, c := range All() {
		t.Run(c.Name, func(t *testing.T) { f(t, c) })
	}
}

func prefix(testing.TB) string { return Name("t") + "/" }

// Name is base with a suffix no earlier run used, for keys and job names
// on shared servers.
func Name(base string) string {
	return base + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
}

func open(t testing.TB, url string) Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := storage.Open(ctx, url)
	if err != nil {
		t.Fatalf("open %s: %v", url, err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func redisStore(t testing.TB, opts ...redisstore.Option) Store {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: testenv.RedisAddrs(t, 1)[0]})
	s, err := redisstore.New(c, append([]redisstore.Option{redisstore.WithPrefix(prefix(t))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(); _ = c.Close() })
	return s
}

func redlockStore(t testing.TB, opts ...redlockstore.Option) Store {
	t.Helper()
	var clients []redlockstore.Client
	for _, a := range testenv.RedisAddrs(t, 5)[:3] {
		c := redis.NewClient(&redis.Options{Addr: a})
		t.Cleanup(func() { _ = c.Close() })
		clients = append(clients, c)
	}
	s, err := redlockstore.New(clients, append([]redlockstore.Option{redlockstore.WithPrefix(prefix(t))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}
