package redlockstore_test

import (
	"context"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/storage/redlockstore"
)

// Warm fills each node's pool; a node that does not answer is an error
// that names it, and the others are warmed all the same.
func TestWarm(t *testing.T) {
	c := newCluster(t, 3)
	cs := make([]redlockstore.Client, 3)
	for i, a := range c.addrs {
		rc := redis.NewClient(&redis.Options{Addr: a, PoolSize: 4, MaxRetries: -1})
		t.Cleanup(func() { rc.Close() })
		cs[i] = rc
	}
	s := newStore(t, cs)
	ctx := context.Background()
	if err := s.Warm(ctx, 3); err != nil {
		t.Fatal(err)
	}
	for i, rc := range cs {
		if idle := rc.(*redis.Client).PoolStats().IdleConns; idle < 3 {
			t.Errorf("node %d: %d idle connections after Warm(3)", i, idle)
		}
	}
	c.procs[1].Kill()
	err := s.Warm(ctx, 0)
	if err == nil || !strings.Contains(err.Error(), "node 1") {
		t.Fatalf("Warm with node 1 down = %v, want an error naming node 1", err)
	}
	for _, i := range []int{0, 2} {
		if idle := cs[i].(*redis.Client).PoolStats().IdleConns; idle != 4 {
			t.Errorf("node %d: %d idle connections after Warm(0), want the pool's size, 4", i, idle)
		}
	}
}
