package redisstore_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/lock/locktest"
	"github.com/oncekit/oncekit/internal/testenv"
)

// The conformance suite against a real three-primary Redis Cluster: the
// hash tag keeps each lock's keys and channel in one slot, and waiters
// subscribe on the shard that owns their key.
func TestConformanceCluster(t *testing.T) {
	addrs := testenv.RedisClusterAddrs(t)
	var counters sync.Map // lock.Locker -> *counter
	locktest.Run(t, locktest.Config{
		NewLocker: func(t *testing.T) lock.Locker {
			c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
			rt := &counter{}
			c.AddHook(rt)
			t.Cleanup(func() { c.Close() })
			s := newStore(t, c)
			counters.Store(lock.Locker(s), rt)
			return s
		},
		RoundTrips: func(l lock.Locker) int64 { c, _ := counters.Load(l); return c.(*counter).N.Load() },
		Reentrant:  true,
	})
}

// Waiters on keys of all three shards at once, through one Store.
func TestClusterWaitersAcrossShards(t *testing.T) {
	addrs := testenv.RedisClusterAddrs(t)
	newC := func() *redis.ClusterClient {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
		t.Cleanup(func() { c.Close() })
		return c
	}
	holderS, waiterS := newStore(t, newC()), newStore(t, newC())
	ctx := ctxT(t, 20*time.Second)
	const keys = 12 // spread over the slots of all shards
	leases := make([]lock.Lease, keys)
	for i := range keys {
		l, err := holderS.Acquire(ctx, fmt.Sprintf("shards-%d", i), 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		leases[i] = l
	}
	got := make(chan error, keys)
	for i := range keys {
		go func() {
			l, err := waiterS.Acquire(ctx, fmt.Sprintf("shards-%d", i), 10*time.Second)
			if err == nil {
				err = l.Release(ctx)
			}
			got <- err
		}()
	}
	for _, l := range leases {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for range keys {
		if err := <-got; err != nil {
			t.Errorf("waiter: %v", err)
		}
	}
}

// Keys with braces keep every name of one lock in one slot (no CROSSSLOT):
// "{}x}" would otherwise make an empty hash tag, and "}x" end it early.
// Distinct keys stay distinct.
func TestClusterKeysWithBraces(t *testing.T) {
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: testenv.RedisClusterAddrs(t)})
	t.Cleanup(func() { c.Close() })
	s := newStore(t, c)
	ctx := ctxT(t, 20*time.Second)
	run := time.Now().Format("150405.000000")
	keys := []string{"{}x}", "}x", "{x", "a{b}c", "%7D", "%", "{%7D}"}
	var leases []lock.Lease
	for _, k := range keys {
		k += run
		l, err := s.TryAcquire(lock.WithOwner(ctx, "o"), k, time.Minute) // the owner hash too
		if err != nil {
			t.Fatalf("TryAcquire(%q): %v", k, err)
		}
		if err := l.Refresh(ctx, time.Minute); err != nil {
			t.Fatalf("Refresh(%q): %v", k, err)
		}
		leases = append(leases, l)
		c, err := s.Begin(ctx, k, "fp", time.Minute)
		if err != nil || c.State != idem.Acquired {
			t.Fatalf("Begin(%q): %v %v", k, c.State, err)
		}
		if err := s.Complete(ctx, c, []byte("ok"), time.Minute); err != nil {
			t.Fatalf("Complete(%q): %v", k, err)
		}
	}
	for _, l := range leases {
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release(%q): %v", l.Key(), err)
		}
	}
}
