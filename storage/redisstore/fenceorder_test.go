package redisstore_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/core/lock"
)

// fenceGate is what a fenced resource does: it refuses a write whose fence
// is not above the last one written (the inventory's sale script).
var fenceGate = redis.NewScript(`
local f = redis.call('GET', KEYS[1])
if f and tonumber(f) >= tonumber(ARGV[1]) then return f end
redis.call('SET', KEYS[1], ARGV[1])
return 'ok'`)

// TestFenceOrderOneStore: many goroutines of one Store take one key through
// a Mutex, each writing through a fence gate while it holds the key, as a
// service's requests do. Every write must pass: a refused one means a
// holder was given a fence below an earlier holder's.
func TestFenceOrderOneStore(t *testing.T) {
	c := newClient(t)
	s := newStore(t, c)
	m, err := lock.NewMutex(s, lock.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	key := fmt.Sprintf("fenceorder/%d", time.Now().UnixNano())
	gate := key + "/gate"
	t.Cleanup(func() { c.Del(context.Background(), gate) })
	var refused, inside atomic.Int64
	var wg sync.WaitGroup
	var firstErr atomic.Value
	for g := range 64 {
		wg.Go(func() {
			for i := range 30 {
				h, err := m.Lock(t.Context(), key)
				if err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
				if inside.Add(1) != 1 {
					t.Errorf("two holders")
				}
				res, err := fenceGate.Run(t.Context(), c, []string{gate}, h.Fence()).Text()
				if err != nil {
					firstErr.CompareAndSwap(nil, err)
				} else if res != "ok" {
					refused.Add(1)
					t.Logf("goroutine %d cycle %d: fence %d refused, gate holds %s", g, i, h.Fence(), res)
				}
				inside.Add(-1)
				if err := h.Release(context.Background()); err != nil {
					firstErr.CompareAndSwap(nil, err)
				}
			}
		})
	}
	wg.Wait()
	if err := firstErr.Load(); err != nil {
		t.Fatal(err)
	}
	if n := refused.Load(); n > 0 {
		t.Errorf("%d of %d writes refused by the fence gate", n, 64*30)
	}
}
