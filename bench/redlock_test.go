package bench

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	goredislib "github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/storage/redlockstore"
)

// quorumImpl builds a locker over five independent servers.
type quorumImpl struct {
	name string
	make func(b *testing.B, cs []*goredislib.Client) locker
}

var fiveNodes = []quorumImpl{
	{"oncekit-fenced", redlockImpl()},
	{"oncekit-unfenced", redlockImpl(redlockstore.WithoutFencing())},
	{"redsync-default", redsync5(nil)},
	{"redsync-10ms", redsync5([]redsync.Option{redsync.WithRetryDelay(10e6)})},
}

func redlockImpl(opts ...redlockstore.Option) func(b *testing.B, cs []*goredislib.Client) locker {
	return func(b *testing.B, cs []*goredislib.Client) locker {
		clients := make([]redlockstore.Client, len(cs))
		for i, c := range cs {
			clients[i] = c
		}
		s, err := redlockstore.New(clients, opts...)
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

func redsync5(extra []redsync.Option) func(b *testing.B, cs []*goredislib.Client) locker {
	return func(b *testing.B, cs []*goredislib.Client) locker {
		pools := make([]redis.Pool, len(cs))
		for i, c := range cs {
			pools[i] = goredis.NewPool(c)
		}
		rs := redsync.New(pools...)
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

func fiveClients(b *testing.B, cc *commandCounter) []*goredislib.Client {
	addrs := testenv.RedisAddrs(b, 5)[:5]
	cs := make([]*goredislib.Client, len(addrs))
	for i, a := range addrs {
		c := goredislib.NewClient(&goredislib.Options{Addr: a, PoolSize: 64})
		c.AddHook(cc)
		b.Cleanup(func() { c.Close() })
		cs[i] = c
	}
	return cs
}

// BenchmarkRedlockUncontended: one goroutine, acquire + release on five
// independent servers, the same key every cycle (oncekit keeps a key its
// process takes over and over: redlockstore.WithLinger).
func BenchmarkRedlockUncontended(b *testing.B) { redlockUncontended(b, false) }

// BenchmarkRedlockUncontendedNewKey: the same with a new key every cycle.
func BenchmarkRedlockUncontendedNewKey(b *testing.B) { redlockUncontended(b, true) }

func redlockUncontended(b *testing.B, newKey bool) {
	for _, im := range fiveNodes {
		b.Run(im.name, func(b *testing.B) {
			cc := &commandCounter{}
			lock := im.make(b, fiveClients(b, cc))
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
			i := 0
			for b.Loop() {
				key := keys[i%len(keys)]
				i++
				release, err := lock(context.Background(), key)
				if err != nil {
					b.Fatal(err)
				}
				if err := release(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "cycles/s")
			b.ReportMetric(float64(cc.n.Load()-cmds0)/float64(b.N), "cmds/cycle")
		})
	}
}

// BenchmarkRedlockContended16: 16 goroutines on one key over five servers,
// in one process or as 16 processes.
func BenchmarkRedlockContended16(b *testing.B) {
	for _, procs := range []int{1, 16} {
		for _, im := range fiveNodes {
			b.Run(fmt.Sprintf("procs=%d/%s", procs, im.name), func(b *testing.B) {
				cc := &commandCounter{}
				lockers := make([]locker, procs)
				for i := range lockers {
					lockers[i] = im.make(b, fiveClients(b, cc))
				}
				contended(b, lockers, cc, 16, benchKey(im.name))
			})
		}
	}
}

// BenchmarkRedlockHandOff16: one key, 16 processes over five servers, each
// pausing 1 ms after its cycle, so that no process takes the key back from
// itself: every acquisition is a hand-off between processes.
func BenchmarkRedlockHandOff16(b *testing.B) {
	for _, im := range fiveNodes {
		b.Run(im.name, func(b *testing.B) {
			cc := &commandCounter{}
			lockers := make([]locker, 16)
			for i := range lockers {
				lockers[i] = im.make(b, fiveClients(b, cc))
			}
			addrs := testenv.RedisAddrs(b, 5)[:5]
			cmds0 := serverCommands(b, addrs)
			contendedPausing(b, lockers, cc, 16, benchKey(im.name), time.Millisecond)
			b.ReportMetric(float64(serverCommands(b, addrs)-cmds0-int64(len(addrs)))/float64(b.N), "server-cmds/cycle")
		})
	}
}
