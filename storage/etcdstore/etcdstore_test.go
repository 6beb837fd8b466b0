package etcdstore_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"

	"google.golang.org/grpc"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/idem/idemtest"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/lock/locktest"
	"github.com/oncekit/oncekit/core/observe"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/stock/stockdriver"
	"github.com/oncekit/oncekit/stock/stocktest"
	"github.com/oncekit/oncekit/storage/etcdstore"
)

func TestMain(m *testing.M) {
	// A holder process of the lock suite, a runner process of the idem suite.
	newStore := func() (*etcdstore.Store, error) {
		addrs, err := testenv.HolderAddrs("ETCD_ENDPOINTS", 1)
		if err != nil {
			return nil, err
		}
		c, err := clientv3.New(clientv3.Config{Endpoints: addrs, DialTimeout: 5 * time.Second})
		if err != nil {
			return nil, err
		}
		return etcdstore.New(c)
	}
	locktest.RunHolder(func() (lock.Locker, error) { return newStore() })
	idemtest.RunRunner(func() (idemdriver.Store, error) { return newStore() })
	stocktest.RunWorker(func() (stockdriver.Store, error) { return newStore() })
	goleak.VerifyTestMain(m,
		// The etcd client's gRPC machinery winds down asynchronously.
		goleak.IgnoreTopFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
		goleak.IgnoreTopFunction("google.golang.org/grpc.(*addrConn).resetTransportAndUnlock"),
	)
}

// rpcs counts unary calls to etcd, except granting a session lease (the
// Store's once-per-session set-up).
type rpcs struct{ n atomic.Int64 }

func (r *rpcs) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
	invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	// A session's upkeep is not a call's: its grant, and the heartbeat it
	// writes then and after every keep-alive (keep-alives are a stream,
	// never counted here).
	put, isPut := req.(*etcdserverpb.PutRequest)
	if !strings.HasSuffix(method, "/LeaseGrant") && !(isPut && strings.Contains(string(put.Key), "\x00session/")) {
		r.n.Add(1)
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

func newClient(t testing.TB, endpoints []string, counters ...*rpcs) *clientv3.Client {
	t.Helper()
	var dial []grpc.DialOption
	for _, c := range counters {
		dial = append(dial, grpc.WithChainUnaryInterceptor(c.intercept))
	}
	c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, DialOptions: dial})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func newStore(t testing.TB, c etcdstore.Client, opts ...etcdstore.Option) *etcdstore.Store {
	t.Helper()
	s, err := etcdstore.New(c, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestConformance(t *testing.T) {
	t.Parallel()
	eps := testenv.EtcdAddrs(t)
	var counters sync.Map // lock.Locker -> *rpcs
	locktest.Run(t, locktest.Config{
		NewLocker: func(t *testing.T) lock.Locker {
			rt := &rpcs{}
			s := newStore(t, newClient(t, eps, rt))
			counters.Store(lock.Locker(s), rt)
			return s
		},
		RoundTrips:    func(l lock.Locker) int64 { c, _ := counters.Load(l); return c.(*rpcs).n.Load() },
		Reentrant:     true,
		HolderProcess: true,
		// A lease's etcd session TTL is its TTL rounded up to whole seconds.
		Lag: time.Second,
	})
}

// A waiter reports the hand-off from its predecessor's deletion.
func TestHandOffReported(t *testing.T) {
	ev := testenv.NewEvents()
	eps := testenv.EtcdAddrs(t)
	testenv.CheckHandOff(t, newStore(t, newClient(t, eps)), newStore(t, newClient(t, eps), etcdstore.WithObserver(ev)), ev, observe.Notified)
}
