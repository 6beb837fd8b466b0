package redisstore_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/storage/redisstore"
)

// A process that died while queued (its place planted here, live for a
// minute) is woken by one release and skipped by the next: its place is
// cut to the wake grace when it is woken, and dropped once that passes.
func TestDeadQueueMemberIsSkipped(t *testing.T) {
	c := newClient(t)
	opts := []redisstore.Option{redisstore.WithBackoff(time.Millisecond, 25*time.Millisecond)} // wake grace 100 ms
	s := newStore(t, c, opts...)
	ctx := ctxT(t, 20*time.Second)
	key := "dead-member-" + time.Now().Format("150405.000000")
	q, qx := "oncekit:lock:{"+key+"}:q", "oncekit:lock:{"+key+"}:qx"

	held, err := s.Acquire(ctx, key, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UnixMilli()
	if err := c.ZAdd(ctx, q, redisZ(0, "dead")).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.HSet(ctx, qx, "dead", now+60_000).Err(); err != nil {
		t.Fatal(err)
	}
	flagWaiters(t, c, "oncekit:lock:{"+key+"}")
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	exp, err := c.HGet(ctx, qx, "dead").Int64()
	if err != nil {
		t.Fatal(err)
	}
	if exp > time.Now().UnixMilli()+150 {
		t.Errorf("the woken member keeps its place until %d, %d ms from now; want the 100 ms grace",
			exp, exp-time.Now().UnixMilli())
	}

	time.Sleep(150 * time.Millisecond) // past the grace
	again, err := s.Acquire(ctx, key, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := again.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.ZScore(ctx, q, "dead").Err(); err == nil {
		t.Error("a release after the grace still found the dead member queued")
	}
}

func redisZ(score float64, member string) redis.Z { return redis.Z{Score: score, Member: member} }
