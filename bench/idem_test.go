package bench

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/storage/etcdstore"
	"github.com/oncekit/oncekit/storage/redisstore"
	"github.com/oncekit/oncekit/storage/redlockstore"
)

// grpcCounter counts unary etcd calls.
type grpcCounter struct{ n atomic.Int64 }

func (g *grpcCounter) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
	invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if !strings.HasSuffix(method, "/LeaseGrant") {
		g.n.Add(1)
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

type idemImpl struct {
	name    string
	perTrip float64 // requests per round trip (N for a fan-out to N nodes)
	make    func(b *testing.B) (idemdriver.Store, func() int64)
}

var idemImpls = []idemImpl{
	{"redisstore", 1, func(b *testing.B) (idemdriver.Store, func() int64) {
		cc := &commandCounter{}
		c, _ := client(b, testenv.RedisAddrs(b, 1)[0])
		c.AddHook(cc)
		s, err := redisstore.New(c)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		return s, cc.n.Load
	}},
	{"redlockstore", 5, func(b *testing.B) (idemdriver.Store, func() int64) {
		cc := &commandCounter{}
		cs := fiveClients(b, cc)
		clients := make([]redlockstore.Client, len(cs))
		for i, c := range cs {
			clients[i] = c
		}
		s, err := redlockstore.New(clients)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		return s, cc.n.Load
	}},
	{"etcdstore", 1, func(b *testing.B) (idemdriver.Store, func() int64) {
		gc := &grpcCounter{}
		c, err := clientv3.New(clientv3.Config{Endpoints: testenv.EtcdAddrs(b), DialTimeout: 5 * time.Second,
			Logger: zap.NewNop(), DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(gc.intercept)}})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Close() })
		s, err := etcdstore.New(c)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		return s, gc.n.Load
	}},
}

// BenchmarkGuardDo: idem.Guard.Do with a trivial run, for a new key every
// call (claim, run, complete) and for a replay of a completed key.
func BenchmarkGuardDo(b *testing.B) {
	run := func(context.Context) ([]byte, error) { return []byte(`{"order":1001}`), nil }
	for _, im := range idemImpls {
		for _, mode := range []string{"new", "replay"} {
			b.Run(im.name+"/"+mode, func(b *testing.B) {
				st, requests := im.make(b)
				g, err := idem.NewGuard(st)
				if err != nil {
					b.Fatal(err)
				}
				ctx := context.Background()
				prefix := fmt.Sprintf("bench-%d-", time.Now().UnixNano())
				replayKey := idemdriver.ScopedKey("bench", prefix+"replay")
				for _, k := range []string{idemdriver.ScopedKey("bench", prefix+"warm"), replayKey} {
					if _, _, err := g.Do(ctx, k, "fp", run); err != nil { // loads scripts, opens sessions
						b.Fatal(err)
					}
				}
				r0 := requests()
				b.ResetTimer()
				i := 0
				for b.Loop() {
					k := replayKey
					if mode == "new" {
						i++
						k = idemdriver.ScopedKey("bench", fmt.Sprintf("%s%d", prefix, i))
					}
					_, replayed, err := g.Do(ctx, k, "fp", run)
					if err != nil || replayed != (mode == "replay") {
						b.Fatalf("Do: replayed=%v err=%v", replayed, err)
					}
				}
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
				b.ReportMetric(float64(requests()-r0)/float64(b.N)/im.perTrip, "roundtrips/op")
			})
		}
	}
}
