package redisstore_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/internal/testenv"
)

// Warm leaves n connections idle in the client's pool, the pool's size
// for n ≤ 0, and fails on a closed Store.
func TestWarm(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: testenv.RedisAddrs(t, 1)[0], PoolSize: 6})
	t.Cleanup(func() { _ = c.Close() })
	s := newStore(t, c)
	ctx := context.Background()
	if err := s.Warm(ctx, 4); err != nil {
		t.Fatal(err)
	}
	if idle := c.PoolStats().IdleConns; idle < 4 {
		t.Fatalf("%d idle connections after Warm(4), want 4 or more", idle)
	}
	if err := s.Warm(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if idle := c.PoolStats().IdleConns; idle != 6 {
		t.Fatalf("%d idle connections after Warm(0), want the pool's size, 6", idle)
	}
	_ = s.Close()
	if err := s.Warm(ctx, 1); !errors.Is(err, lock.ErrClosed) {
		t.Fatalf("Warm on a closed Store = %v, want lock.ErrClosed", err)
	}
}

// On a Cluster, Warm fills each primary's pool.
func TestWarmCluster(t *testing.T) {
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: testenv.RedisClusterAddrs(t), PoolSize: 3})
	t.Cleanup(func() { _ = c.Close() })
	s := newStore(t, c)
	ctx := context.Background()
	if err := s.Warm(ctx, 2); err != nil {
		t.Fatal(err)
	}
	var shards atomic.Int32 // (ForEachShard calls concurrently)
	if err := c.ForEachShard(ctx, func(ctx context.Context, shard *redis.Client) error {
		shards.Add(1)
		if idle := shard.PoolStats().IdleConns; idle < 2 {
			t.Errorf("shard %s: %d idle connections after Warm(2)", shard.Options().Addr, idle)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if n := shards.Load(); n < 3 {
		t.Fatalf("%d shards, want the cluster's 3", n)
	}
}
