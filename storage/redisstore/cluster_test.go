package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/lock/locktest"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/storage/redisstore"
)

// The conformance suite against a real three-primary Redis Cluster: the
// hash tag keeps each lock's keys and channel in one slot, and waiters
// subscribe on the shard that owns their key.
func TestConformanceCluster(t *testing.T) {
	t.Parallel()
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
		RoundTrips:   func(l lock.Locker) int64 { c, _ := counters.Load(l); return c.(*counter).N.Load() },
		Reentrant:    true,
		FenceAtLeast: true, // InspectLock reports the hold's last fence
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
		c, err := s.Begin(ctx, idemdriver.MustKey(k), "fp", time.Minute)
		if err != nil || c.State != idemdriver.Acquired {
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

// A placed record (idem.Placed) lives in its place's slot: a Guard's run
// commits an effect on keys tagged {place} — none of them named after the
// record — in the script that completes it, for places on every shard, and
// a duplicate replays without running.
func TestClusterPlacedEffect(t *testing.T) {
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: testenv.RedisClusterAddrs(t)})
	t.Cleanup(func() { c.Close() })
	g, err := idem.NewGuard(newStore(t, c))
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 20*time.Second)
	run := time.Now().Format("150405.000000")
	add := redisstore.NewEffectScript(`redis.call('INCRBY', KEYS[1], ARGV[1]); redis.call('SADD', KEYS[2], ARGV[2])`)
	for i := range 12 { // spread over the slots of all shards
		place := fmt.Sprintf("sku-%d-%s", i, run)
		stock, orders := "stock:{"+place+"}", "orders:{"+place+"}"
		key, err := idem.Placed(place, idemdriver.ScopedKey("user-1", "k"))
		if err != nil {
			t.Fatal(err)
		}
		for range 2 {
			_, _, err := g.Do(ctx, key, "fp", func(ctx context.Context) ([]byte, error) {
				stored, _ := idem.KeyFrom(ctx)
				if got := redisstore.EffectKey(stored, "x:"); got != "x:{"+place+"}" {
					t.Errorf("EffectKey of a placed key = %q", got)
				}
				return []byte("sold"), idem.Commit(ctx, redisstore.Effect{Script: add, Keys: []string{stock, orders}, Args: []any{-1, "o-1"}})
			})
			if err != nil {
				t.Fatalf("place %s: %v", place, err)
			}
		}
		if n, err := c.Get(ctx, stock).Int(); err != nil || n != -1 {
			t.Errorf("place %s: the effect ran %d times (%v), want once", place, -n, err)
		}
	}
}

// A Cluster shard's primary killed while a key it serves is held and a
// claim is in flight, its replicas cut off just before the grants (as a
// slow link would leave them). Without WithReplicas the replica the
// cluster promotes never got them: another client takes the key and runs
// the claim — the hazard. With WithReplicas(1) nothing is granted while
// the replicas cannot acknowledge; once they can, the promoted replica has
// both grants, so nobody else takes the key or runs the claim; the holder
// carries on through the new primary, and the next holder's fence is
// higher.
func TestClusterFailover(t *testing.T) {
	t.Parallel()
	for _, acked := range []bool{false, true} {
		name := "without-replicas-option"
		if acked {
			name = "with-replicas-option"
		}
		t.Run(name, func(t *testing.T) { t.Parallel(); clusterFailover(t, acked) })
	}
}

func clusterFailover(t *testing.T, acked bool) {
	rc := testenv.StartRedisCluster(t, 3, 2) // a shard keeps a replica after its failover
	connect := func() *redisstore.Store {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: rc.Addrs(), MaxRedirects: 16})
		t.Cleanup(func() { c.Close() })
		if !acked {
			return newStore(t, c)
		}
		return newStore(t, c, redisstore.WithReplicas(1, time.Second))
	}
	first := connect()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const key = "cluster-failover" // the lock and the record share its slot
	primary := rc.PrimaryOf("{" + key + "}")
	rc.HoldReplication(primary)
	held, lockErr := first.Acquire(ctx, key, 2*time.Minute)
	claim, beginErr := first.Begin(ctx, idemdriver.MustKey(key), "fp", 2*time.Minute)
	if acked {
		if !errors.Is(lockErr, redisstore.ErrNotReplicated) || !errors.Is(beginErr, redisstore.ErrNotReplicated) {
			t.Fatalf("with the replicas cut off: Acquire %v, Begin %v; want ErrNotReplicated", lockErr, beginErr)
		}
		rc.ResumeReplication(primary)
		if held, lockErr = first.Acquire(ctx, key, 2*time.Minute); lockErr != nil {
			t.Fatal(lockErr)
		}
		claim, beginErr = first.Begin(ctx, idemdriver.MustKey(key), "fp", 2*time.Minute)
	}
	if lockErr != nil || beginErr != nil || claim.State != idemdriver.Acquired {
		t.Fatalf("Acquire %v, Begin %+v %v", lockErr, claim, beginErr)
	}
	primary.Kill()
	promoted := rc.WaitFailover("{"+key+"}", primary, 30*time.Second)
	rc.WaitOK(30 * time.Second) // every live node knows
	t.Logf("%s promoted after %s was killed", promoted.Addr, primary.Addr)

	// retry asks again while the clients learn the new primary (the Store
	// reloads a Cluster client's map when the slot's node refuses it).
	retry := func(what string, f func() error) {
		t.Helper()
		var err error
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
			if err = f(); err == nil {
				return
			}
		}
		t.Fatalf("%s after the failover: %v", what, err)
	}
	second := connect()
	if !acked {
		// The hazard: the promoted replica never had the grants.
		var other lock.Lease
		retry("TryAcquire by another client", func() (err error) { other, err = second.TryAcquire(ctx, key, time.Minute); return err })
		defer other.Release(context.Background())
		if other.Fence() <= held.Fence() {
			t.Errorf("the second holder's fence %d is not above the first's %d", other.Fence(), held.Fence())
		}
		retry("Begin by another client", func() error {
			c, err := second.Begin(ctx, idemdriver.MustKey(key), "fp", time.Minute)
			if err == nil && c.State != idemdriver.Acquired {
				t.Fatalf("Begin after the failover: %v; the cut-off replica was expected to lack the claim", c.State)
			}
			return err
		})
		t.Log("without WithReplicas: a second holder and a second run after the failover, as documented")
		return
	}
	retry("TryAcquire by another client", func() error {
		_, err := second.TryAcquire(ctx, key, time.Minute)
		if errors.Is(err, lock.ErrNotAcquired) {
			return nil // still held: no second holder
		}
		if err == nil {
			t.Fatal("another client took the key after the failover: two holders")
		}
		return err
	})
	retry("Begin by another client", func() error {
		c, err := second.Begin(ctx, idemdriver.MustKey(key), "fp", time.Minute)
		if err == nil && c.State != idemdriver.InFlight {
			t.Fatalf("Begin after the failover: %v, want the claim still in flight", c.State)
		}
		return err
	})
	retry("Complete through the new primary", func() error { return first.Complete(ctx, claim, []byte("once"), time.Minute) })
	retry("Release through the new primary", func() error { return held.Release(ctx) })
	afterFailover(ctx, t, second, key, key, held.Fence())
}

// afterFailover checks, through a client of the new primary, that the
// next holder of key gets a fence above the last one before the failover
// and that record's claim, completed with "once" through the new primary,
// is replayed.
func afterFailover(ctx context.Context, t *testing.T, s *redisstore.Store, key, record string, before uint64) {
	t.Helper()
	next, err := s.Acquire(ctx, key, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer next.Release(context.Background())
	if next.Fence() <= before {
		t.Errorf("fence after the failover %d, not above %d", next.Fence(), before)
	}
	if c, err := s.Begin(ctx, idemdriver.MustKey(record), "fp", time.Minute); err != nil || c.State != idemdriver.Completed || string(c.Result) != "once" {
		t.Errorf("replay after the failover: %+v %v", c, err)
	}
}
