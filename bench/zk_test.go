package bench

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/storage/zkstore"
)

// The ZooKeeper lock against go-zookeeper's own zk.Lock (the recipe users
// of that client know: an ephemeral sequential node, a watch on the
// predecessor), on the ensemble of `make services-up`. A "process" is a
// ZooKeeper session of its own.

type zkImpl struct {
	name string
	make func(b *testing.B, n int) []locker // n processes
}

const zkSession = 10 * time.Second

var zkImpls = []zkImpl{
	{"oncekit", func(b *testing.B, n int) []locker {
		ls := make([]locker, n)
		for i := range ls {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			s, err := zkstore.Connect(ctx, testenv.ZooKeeperAddrs(b), zkstore.WithSessionTimeout(zkSession))
			cancel()
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close() })
			ls[i] = func(ctx context.Context, key string) (func() error, error) {
				l, err := s.Acquire(ctx, key, ttl)
				if err != nil {
					return nil, err
				}
				return func() error { return l.Release(ctx) }, nil
			}
		}
		return ls
	}},
	{"zk.Lock", func(b *testing.B, n int) []locker {
		ls := make([]locker, n)
		for i := range ls {
			c, _, err := zk.Connect(testenv.ZooKeeperAddrs(b), zkSession, zk.WithLogInfo(false), zk.WithLogger(quietZK{}))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(c.Close)
			ls[i] = func(_ context.Context, key string) (func() error, error) {
				l := zk.NewLock(c, "/bench-zk-lock/"+strings.ReplaceAll(key, "/", "_"), zk.WorldACL(zk.PermAll))
				if err := l.Lock(); err != nil {
					return nil, err
				}
				return l.Unlock, nil
			}
		}
		return ls
	}},
}

type quietZK struct{}

func (quietZK) Printf(string, ...any) {}

// BenchmarkZKUncontended: one goroutine, acquire + release, the same key
// every cycle, then a new key every cycle.
func BenchmarkZKUncontended(b *testing.B) {
	for _, newKey := range []bool{false, true} {
		for _, im := range zkImpls {
			name := "same-key/" + im.name
			if newKey {
				name = "new-key/" + im.name
			}
			b.Run(name, func(b *testing.B) {
				lock := im.make(b, 1)[0]
				key := benchKey(im.name)
				warm(b, lock, key)
				i := 0
				for b.Loop() {
					k := key
					if newKey {
						k = fmt.Sprintf("%s:%d", key, i)
					}
					i++
					release, err := lock(context.Background(), k)
					if err != nil {
						b.Fatal(err)
					}
					if err := release(); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "cycles/s")
			})
		}
	}
}

// BenchmarkZKContended16: 16 goroutines on one key, all in one process
// (one session), or each a process of its own (16 sessions).
func BenchmarkZKContended16(b *testing.B) {
	for _, procs := range []int{1, 16} {
		for _, im := range zkImpls {
			b.Run(fmt.Sprintf("procs=%d/%s", procs, im.name), func(b *testing.B) {
				ls := im.make(b, procs)
				for len(ls) < 16 {
					ls = append(ls, ls[0]) // goroutines of one process share its session
				}
				contended(b, ls, &commandCounter{}, 16, benchKey(im.name))
			})
		}
	}
}

// BenchmarkZKHandOff measures release → next waiter holding the key: two
// processes pass the key back and forth; the time from the holder's
// Release to the waiter's Acquire returning is recorded.
func BenchmarkZKHandOff(b *testing.B) {
	for _, im := range zkImpls {
		b.Run(im.name, func(b *testing.B) {
			handOff(b, im.make(b, 2), benchKey(im.name), 5*time.Millisecond)
		})
	}
}
