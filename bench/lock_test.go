package bench

import (
	"context"
	"crypto/sha1"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/storage/redisstore"
)

// locker is the common shape of the libraries under test: take key
// (waiting while it is held) and return the function that releases it.
type locker func(ctx context.Context, key string) (release func() error, err error)

// commandCounter counts the requests a client sends.
type commandCounter struct{ n atomic.Int64 }

func (c *commandCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *commandCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { c.n.Add(1); return next(ctx, cmd) }
}
func (c *commandCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { c.n.Add(int64(len(cmds))); return next(ctx, cmds) }
}

const ttl = 10 * time.Second

type impl struct {
	name string
	make func(b *testing.B, c *redis.Client) locker
}

// The peers poll; each is given a poll interval as well as its default
// where the default differs, so neither is judged only by a slow setting.
var singleNode = []impl{
	{"oncekit", redisstoreImpl()},
	{"redislock-linear10ms", func(b *testing.B, c *redis.Client) locker {
		rl := redislock.New(c)
		opts := &redislock.Options{RetryStrategy: redislock.LinearBackoff(10 * time.Millisecond)}
		return func(ctx context.Context, key string) (func() error, error) {
			l, err := rl.Obtain(ctx, key, ttl, opts)
			if err != nil {
				return nil, err
			}
			return func() error { return l.Release(context.WithoutCancel(ctx)) }, nil
		}
	}},
	{"redsync-default", redsyncImpl(nil)},
	{"redsync-10ms", redsyncImpl([]redsync.Option{redsync.WithRetryDelay(10 * time.Millisecond)})},
}

func redisstoreImpl(opts ...redisstore.Option) func(b *testing.B, c *redis.Client) locker {
	return func(b *testing.B, c *redis.Client) locker {
		s, err := redisstore.New(c, opts...)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		return func(ctx context.Context, key string) (func() error, error) {
			l, err := s.Acquire(ctx, key, ttl)
			if err != nil {
				return nil, err
			}
			return func() error { return l.Release(ctx) }, nil
		}
	}
}

func redsyncImpl(extra []redsync.Option) func(b *testing.B, c *redis.Client) locker {
	return func(b *testing.B, c *redis.Client) locker {
		rs := redsync.New(goredis.NewPool(c))
		opts := append([]redsync.Option{redsync.WithExpiry(ttl), redsync.WithTries(1 << 20)}, extra...)
		return func(ctx context.Context, key string) (func() error, error) {
			m := rs.NewMutex(key, opts...)
			if err := m.LockContext(ctx); err != nil {
				return nil, err
			}
			return func() error {
				ok, err := m.UnlockContext(context.WithoutCancel(ctx))
				if err == nil && !ok {
					err = errors.New("redsync: unlock failed")
				}
				return err
			}, nil
		}
	}
}

func client(b *testing.B, addr string) (*redis.Client, *commandCounter) {
	cc := &commandCounter{}
	// ContextTimeoutEnabled, as the README recommends, for every library.
	c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 64, ContextTimeoutEnabled: true})
	c.AddHook(cc)
	b.Cleanup(func() { c.Close() })
	return c, cc
}

var keySeq atomic.Int64

func benchKey(name string) string {
	return fmt.Sprintf("bench:%s:%d:%d", name, time.Now().UnixNano(), keySeq.Add(1))
}

// BenchmarkUncontended: one goroutine, acquire + release on a free key,
// the same key every cycle. oncekit keeps a key its process takes over and
// over (redisstore.WithLinger): see BenchmarkUncontendedNewKey for the
// cost of a key taken once.
func BenchmarkUncontended(b *testing.B) { uncontended(b, false) }

// BenchmarkUncontendedNewKey: one goroutine, acquire + release of a new key
// every cycle, so that every cycle is a round trip each way in every
// library.
func BenchmarkUncontendedNewKey(b *testing.B) { uncontended(b, true) }

func uncontended(b *testing.B, newKey bool) {
	addr := testenv.RedisAddrs(b, 1)[0]
	for _, im := range singleNode {
		b.Run(im.name, func(b *testing.B) {
			c, cc := client(b, addr)
			lock := im.make(b, c)
			ctx := context.Background()
			key := benchKey(im.name)
			warm(b, lock, key)
			keys := []string{key}
			if newKey {
				keys = make([]string, 1<<16)
				for i := range keys {
					keys[i] = fmt.Sprintf("%s:%d", key, i)
				}
			}
			cmds0 := cc.n.Load()
			b.ResetTimer()
			start := time.Now()
			i := 0
			for b.Loop() {
				key := keys[i%len(keys)]
				i++
				release, err := lock(ctx, key)
				if err != nil {
					b.Fatal(err)
				}
				if err := release(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "cycles/s")
			b.ReportMetric(float64(cc.n.Load()-cmds0)/float64(b.N), "cmds/cycle")
		})
	}
}

func warm(b *testing.B, lock locker, key string) {
	release, err := lock(context.Background(), key+":warm")
	if err != nil {
		b.Fatal(err)
	}
	if err := release(); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkContended16: 16 goroutines take turns on one key with an empty
// critical section, either in one process (one client, one Locker) or as 16
// processes (16 clients, 16 Lockers). Reports cycles/s, acquire latency
// percentiles and maximum, and Redis commands per successful acquisition.
func BenchmarkContended16(b *testing.B) {
	addr := testenv.RedisAddrs(b, 1)[0]
	for _, procs := range []int{1, 16} {
		for _, im := range singleNode {
			b.Run(fmt.Sprintf("procs=%d/%s", procs, im.name), func(b *testing.B) {
				cc := &commandCounter{}
				lockers := make([]locker, procs)
				for i := range lockers {
					c, _ := client(b, addr)
					c.AddHook(cc)
					lockers[i] = im.make(b, c)
				}
				contended(b, lockers, cc, 16, benchKey(im.name))
			})
		}
	}
}

func contended(b *testing.B, lockers []locker, cc *commandCounter, workers int, key string) {
	contendedPausing(b, lockers, cc, workers, key, 0)
}

// contendedPausing is contended with each worker pausing for pause after
// each of its cycles (so that a release finds no goroutine of its own
// process waiting, and the key goes to another process).
func contendedPausing(b *testing.B, lockers []locker, cc *commandCounter, workers int, key string, pause time.Duration) {
	warm(b, lockers[0], key)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var (
		remaining atomic.Int64
		mu        sync.Mutex
		lat       = make([]time.Duration, 0, b.N)
		wg        sync.WaitGroup
		failed    atomic.Value
	)
	remaining.Store(int64(b.N))
	cmds0 := cc.n.Load()
	b.ResetTimer()
	start := time.Now()
	for i := range workers {
		lock := lockers[i%len(lockers)]
		wg.Go(func() {
			local := make([]time.Duration, 0, b.N/workers+1)
			defer func() { mu.Lock(); lat = append(lat, local...); mu.Unlock() }()
			for remaining.Add(-1) >= 0 {
				t0 := time.Now()
				release, err := lock(ctx, key)
				if err != nil {
					failed.Store(err)
					return
				}
				local = append(local, time.Since(t0))
				if err := release(); err != nil {
					failed.Store(err)
					return
				}
				if pause > 0 {
					time.Sleep(pause)
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
	pct := percentilesMs(lat)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "cycles/s")
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
	b.ReportMetric(pct(0.999), "p99.9-ms")
	b.ReportMetric(pct(1), "max-ms")
	b.ReportMetric(float64(cc.n.Load()-cmds0)/float64(b.N), "cmds/acquire")
}

// percentilesMs sorts lat and returns its p-th percentile in ms (p in
// [0, 1]; 0 for no latencies).
func percentilesMs(lat []time.Duration) func(p float64) float64 {
	slices.Sort(lat)
	return func(p float64) float64 {
		if len(lat) == 0 {
			return 0
		}
		return float64(lat[min(len(lat)-1, int(p*float64(len(lat))))].Microseconds()) / 1000
	}
}

// scriptCounter counts the acquire-script calls a client sends (either
// script: a first attempt's short one, and the full one): the acquire
// attempts, whether they succeed or not (a first attempt that leaves the
// decision to the full script counts twice).
type scriptCounter struct {
	shas []string
	n    atomic.Int64
}

func (c *scriptCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *scriptCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if args := cmd.Args(); len(args) > 1 && (cmd.Name() == "evalsha" && slices.Contains(c.shas, args[1].(string)) || cmd.Name() == "eval") {
			c.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (c *scriptCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// acquireScriptSHAs are the SHAs of redisstore's acquire scripts (a first
// attempt's and the full one), which Redis is asked to run by (EVALSHA):
// the scripts as the driver embeds them, read from the repository (the
// driver's kit is internal to storage/).
func acquireScriptSHAs(b *testing.B) []string {
	b.Helper()
	var shas []string
	for _, last := range []string{"acquire_new.lua", "acquire.lua"} {
		var src []byte
		for _, f := range []string{"acquire_fast.lua", "fence.lua", last} {
			part, err := os.ReadFile(filepath.Join("..", "storage", "internal", "rediskit", "lua", f))
			if err != nil {
				b.Fatal(err)
			}
			src = append(src, part...)
		}
		shas = append(shas, fmt.Sprintf("%x", sha1.Sum(src)))
	}
	return shas
}

// BenchmarkWakeups64: 64 goroutines wait for one key, spread over procs
// processes (Stores). attempts/acquire counts acquire-script calls per
// successful acquisition: the bound is one attempt per waiting process per
// release, however many goroutines wait.
func BenchmarkWakeups64(b *testing.B) {
	addr := testenv.RedisAddrs(b, 1)[0]
	for _, procs := range []int{1, 4, 16} {
		b.Run(fmt.Sprintf("procs=%d", procs), func(b *testing.B) {
			sc := &scriptCounter{shas: acquireScriptSHAs(b)}
			cc := &commandCounter{}
			lockers := make([]locker, procs)
			for i := range lockers {
				c, _ := client(b, addr)
				c.AddHook(sc)
				c.AddHook(cc)
				lockers[i] = singleNode[0].make(b, c)
			}
			a0 := sc.n.Load()
			contended(b, lockers, cc, 64, benchKey("wakeups"))
			b.ReportMetric(float64(sc.n.Load()-a0)/float64(b.N), "attempts/acquire")
			b.ReportMetric(float64(sc.n.Load()-a0)/float64(b.N)/float64(procs), "attempts/acquire/proc")
		})
	}
}
