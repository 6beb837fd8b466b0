package bench

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"

	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/storage/etcdstore"
)

func etcdClient(b *testing.B) *clientv3.Client {
	c, err := clientv3.New(clientv3.Config{Endpoints: testenv.EtcdAddrs(b), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	return c
}

// etcdImpl makes the lockers of one benchmark, one per client given, each
// standing for a process (oncekit: a Store; etcd: a concurrency.Session).
// Lockers given the same client share its connection, as Stores in one
// process would.
type etcdImpl struct {
	name string
	make func(b *testing.B, clients []*clientv3.Client) []locker
}

// sameClient is n times one new client.
func sameClient(b *testing.B, n int) []*clientv3.Client {
	c := etcdClient(b)
	cs := make([]*clientv3.Client, n)
	for i := range cs {
		cs[i] = c
	}
	return cs
}

// ownClients is n new clients.
func ownClients(b *testing.B, n int) []*clientv3.Client {
	cs := make([]*clientv3.Client, n)
	for i := range cs {
		cs[i] = etcdClient(b)
	}
	return cs
}

var etcdImpls = []etcdImpl{
	{"oncekit", func(b *testing.B, clients []*clientv3.Client) []locker {
		ls := make([]locker, len(clients))
		for i, c := range clients {
			s, err := etcdstore.New(c)
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
	{"etcd-concurrency", func(b *testing.B, clients []*clientv3.Client) []locker {
		ls := make([]locker, len(clients))
		for i, c := range clients {
			sess, err := concurrency.NewSession(c, concurrency.WithTTL(10))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { sess.Close() })
			ls[i] = func(ctx context.Context, key string) (func() error, error) {
				m := concurrency.NewMutex(sess, "/bench-etcd/"+key)
				if err := m.Lock(ctx); err != nil {
					return nil, err
				}
				return func() error { return m.Unlock(context.WithoutCancel(ctx)) }, nil
			}
		}
		return ls
	}},
}

// BenchmarkEtcdUncontended: one goroutine, acquire + release, the same key
// every cycle (oncekit keeps a key its process takes over and over:
// etcdstore.WithLinger).
func BenchmarkEtcdUncontended(b *testing.B) { etcdUncontended(b, false) }

// BenchmarkEtcdUncontendedNewKey: the same with a new key every cycle.
func BenchmarkEtcdUncontendedNewKey(b *testing.B) { etcdUncontended(b, true) }

func etcdUncontended(b *testing.B, newKey bool) {
	for _, im := range etcdImpls {
		b.Run(im.name, func(b *testing.B) {
			lock := im.make(b, sameClient(b, 1))[0]
			key := benchKey(im.name)
			warm(b, lock, key)
			keys := []string{key}
			if newKey {
				keys = make([]string, 1<<16)
				for i := range keys {
					keys[i] = fmt.Sprintf("%s:%d", key, i)
				}
			}
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
		})
	}
}

// BenchmarkEtcdHandOff measures release → next waiter holding the key: two
// lockers (processes) pass the key back and forth; the time from the
// holder's Release call to the waiter's Acquire returning is recorded.
func BenchmarkEtcdHandOff(b *testing.B) {
	for _, im := range etcdImpls {
		b.Run(im.name, func(b *testing.B) {
			handOff(b, im.make(b, ownClients(b, 2)), benchKey(im.name), 2*time.Millisecond)
		})
	}
}

// handOff passes key back and forth between two lockers (processes) b.N
// times and reports the time from the holder's Release call to the
// waiter's Acquire returning, p50 and p99. Each waiter is given settle to
// queue and watch before the holder releases.
func handOff(b *testing.B, ls []locker, key string, settle time.Duration) {
	ctx := context.Background()
	release, err := ls[0](ctx, key)
	if err != nil {
		b.Fatal(err)
	}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		waiter := ls[(i+1)%2]
		got := make(chan func() error, 1)
		go func() {
			r, err := waiter(ctx, key)
			if err != nil {
				b.Error(err)
				close(got)
				return
			}
			got <- r
		}()
		time.Sleep(settle)
		t0 := time.Now()
		if err := release(); err != nil {
			b.Fatal(err)
		}
		r, ok := <-got
		if !ok {
			b.FailNow()
		}
		lat = append(lat, time.Since(t0))
		release = r
	}
	b.StopTimer()
	_ = release()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "handoff-p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "handoff-p99-ms")
}

// BenchmarkEtcdContended16: 16 goroutines on one key, with one locker
// (session) among them, or 16 lockers sharing one client, or 16 lockers
// with a client each — as 16 processes would have.
func BenchmarkEtcdContended16(b *testing.B) {
	setups := []struct {
		name    string
		clients func(b *testing.B) []*clientv3.Client
	}{
		{"procs=1", func(b *testing.B) []*clientv3.Client { return sameClient(b, 1) }},
		{"procs=16-one-client", func(b *testing.B) []*clientv3.Client { return sameClient(b, 16) }},
		{"procs=16-own-clients", func(b *testing.B) []*clientv3.Client { return ownClients(b, 16) }},
	}
	for _, setup := range setups {
		for _, im := range etcdImpls {
			if im.name == "etcd-concurrency" && setup.name == "procs=1" {
				continue // a concurrency.Mutex session cannot be shared by waiters on one key
			}
			b.Run(setup.name+"/"+im.name, func(b *testing.B) {
				ls := im.make(b, setup.clients(b))
				contended(b, ls, &commandCounter{}, 16, benchKey(im.name))
			})
		}
	}
}
