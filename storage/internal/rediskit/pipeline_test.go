package rediskit_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/storage/internal/rediskit"
)

var echo = redis.NewScript(`return {KEYS[1], ARGV[1], redis.call('INCR', KEYS[1])}`)

// Many concurrent callers share pipelines; each gets its own reply, in
// order per key, and a script not loaded yet (NOSCRIPT) falls back to EVAL.
func TestAutoPipelineReplies(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: testenv.RedisAddrs(t, 1)[0]})
	defer c.Close()
	if err := c.ScriptFlush(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	p := rediskit.AutoPipeline(c)
	prefix := fmt.Sprintf("pipe-test:%d:", time.Now().UnixNano())
	const callers, calls = 64, 50
	var wg sync.WaitGroup
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := prefix + strconv.Itoa(i)
			for j := 1; j <= calls; j++ {
				v, err := echo.Run(context.Background(), p, []string{key}, j).Slice()
				if err != nil {
					t.Error(err)
					return
				}
				if v[0] != key || v[1] != strconv.Itoa(j) || v[2] != int64(j) {
					t.Errorf("caller %d call %d: reply %v", i, j, v)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// A caller whose context ends stops waiting with the context's error.
func TestAutoPipelineCancel(t *testing.T) {
	srv := testenv.StartRedis(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ReadTimeout: 500 * time.Millisecond})
	defer c.Close()
	p := rediskit.AutoPipeline(c)
	if err := echo.Run(context.Background(), p, []string{"k"}, 1).Err(); err != nil {
		t.Fatal(err)
	}
	srv.Pause()
	defer srv.Resume()
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			if err := echo.Run(ctx, p, []string{"k"}, 1).Err(); err == nil {
				t.Error("a script ran on a paused server")
			}
		}()
	}
	wg.Wait()
}
