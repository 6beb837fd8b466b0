package bench

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/storage/redisstore"
)

// BenchmarkReplicas: the cost of redisstore.WithReplicas on the Sentinel
// deployment of `make services-up` (a primary and two replicas on this
// machine): a new key's lock cycle and a new key's Guard.Do, without and
// with waiting for one and for both replicas, by 1 and 16 workers each with
// its own failover client.
func BenchmarkReplicas(b *testing.B) {
	sentinels, master := testenv.SentinelAddrs(b)
	testenv.QuietRedisDialErrors() // and go-redis' notes on the sentinel it asked
	for _, op := range []string{"lock", "guard"} {
		for _, workers := range []int{1, 16} {
			for _, replicas := range []int{0, 1, 2} {
				b.Run(fmt.Sprintf("%s/workers=%d/replicas=%d", op, workers, replicas), func(b *testing.B) {
					var opts []redisstore.Option
					if replicas > 0 {
						opts = append(opts, redisstore.WithReplicas(replicas, time.Second))
					}
					works := storeWorks(b, op, workers, func() redis.UniversalClient {
						return redis.NewFailoverClient(&redis.FailoverOptions{MasterName: master, SentinelAddrs: sentinels,
							PoolSize: 64, ContextTimeoutEnabled: true})
					}, opts...)
					prefix := benchKey("replicas")
					ctx := context.Background()
					cycles(b, nil, workers, func(w int, i int64) error {
						return works[w](ctx, prefix+":"+strconv.FormatInt(i, 10))
					})
				})
			}
		}
	}
}

// BenchmarkClusterVsSingle: a new key's lock cycle and Guard.Do on the
// three-primary Redis Cluster of `make services-up` against one Redis
// server, in one run, by 1 and 16 workers each with its own client.
func BenchmarkClusterVsSingle(b *testing.B) {
	single := testenv.RedisAddrs(b, 1)[0]
	cluster := testenv.RedisClusterAddrs(b)
	for _, op := range []string{"lock", "guard"} {
		for _, workers := range []int{1, 16} {
			for _, dep := range []string{"single", "cluster"} {
				b.Run(fmt.Sprintf("%s/workers=%d/%s", op, workers, dep), func(b *testing.B) {
					works := storeWorks(b, op, workers, func() redis.UniversalClient {
						if dep == "cluster" {
							return redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster, PoolSize: 64, ContextTimeoutEnabled: true})
						}
						return redis.NewClient(&redis.Options{Addr: single, PoolSize: 64, ContextTimeoutEnabled: true})
					})
					prefix := benchKey("cluster")
					ctx := context.Background()
					cycles(b, nil, workers, func(w int, i int64) error {
						return works[w](ctx, prefix+":"+strconv.FormatInt(i, 10))
					})
				})
			}
		}
	}
}

// storeWorks makes one cycle function per worker, each on a Store of its
// own over a client from newClient: op "lock" takes and releases the key,
// "guard" runs Guard.Do on it.
func storeWorks(b *testing.B, op string, workers int, newClient func() redis.UniversalClient,
	opts ...redisstore.Option) []func(ctx context.Context, key string) error {
	works := make([]func(ctx context.Context, key string) error, workers)
	for w := range works {
		c := newClient()
		b.Cleanup(func() { c.Close() })
		s, err := redisstore.New(c, opts...)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		g, err := idem.NewGuard(s)
		if err != nil {
			b.Fatal(err)
		}
		works[w] = func(ctx context.Context, key string) error {
			if op == "guard" {
				_, _, err := g.Do(ctx, key, "fp", func(context.Context) ([]byte, error) { return []byte("ok"), nil })
				return err
			}
			l, err := s.Acquire(ctx, key, ttl)
			if err != nil {
				return err
			}
			return l.Release(ctx)
		}
	}
	return works
}
