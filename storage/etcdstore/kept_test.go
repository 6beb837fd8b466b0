package etcdstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/storage/etcdstore"
)

// A Store that takes a key again right after letting it go keeps its next
// Release's entry: its next Acquire takes the key with no request, the
// same entry and the next fence, up to WithMaxLocalHandOffs times. Then
// the entry is deleted, and another process waiting for the key gets it,
// with a fence above all of them.
func TestHotKeyKeptForNextAcquire(t *testing.T) {
	eps := testenv.EtcdAddrs(t)
	rt := &rpcs{}
	a := newStore(t, newClient(t, eps, rt), etcdstore.WithLinger(time.Hour),
		etcdstore.WithMaxLocalHold(0), etcdstore.WithMaxLocalHandOffs(4))
	b := newStore(t, newClient(t, eps))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	key := "kept-" + time.Now().Format("150405.000000")
	cycle := func() lock.Lease { return testenv.AcquireRelease(ctx, t, a, key, 10*time.Second) }
	first := cycle()
	last := cycle() // taken again at once: hot, kept
	if last.Fence() <= first.Fence() {
		t.Fatalf("fence %d after %d", last.Fence(), first.Fence())
	}
	if l, err := b.TryAcquire(ctx, key, 10*time.Second); err == nil {
		l.Release(ctx)
		t.Fatal("a hot key's Release let it go; want it kept for the Store")
	}

	got := testenv.AcquireLater(ctx, t, b, key, 10*time.Second)
	time.Sleep(300 * time.Millisecond) // b queued
	before := rt.n.Load()
	last = testenv.KeptCycles(ctx, t, a, key, last, 4, true)
	if n := rt.n.Load() - before; n != 1 {
		t.Errorf("4 kept leases and the release after them made %d requests, want 1 (the delete)", n)
	}
	l := <-got
	if l == nil {
		return
	}
	defer l.Release(context.Background())
	if l.Fence() <= last.Fence() {
		t.Errorf("the waiting process got fence %d after the Store's local fence %d", l.Fence(), last.Fence())
	}
}

// slowRefresh holds back refreshes (a Txn that rewrites an entry's expiry
// keeping its lease) by 300 ms.
func slowRefresh(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
	invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if txn, ok := req.(*etcdserverpb.TxnRequest); ok && strings.HasSuffix(method, "/Txn") {
		for _, op := range txn.Success {
			if put := op.GetRequestPut(); put != nil && put.IgnoreLease {
				time.Sleep(300 * time.Millisecond)
				break
			}
		}
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

// A Refresh still in flight when its lease is released (and its entry kept
// for the Store's next Acquire) must not delete the entry when its reply
// comes: the entry is the next lease's now.
func TestLateRefreshSparesKeptEntry(t *testing.T) {
	eps := testenv.EtcdAddrs(t)
	c, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second,
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(slowRefresh)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	a := newStore(t, c, etcdstore.WithLinger(time.Hour), etcdstore.WithMaxLocalHold(time.Hour))
	b := newStore(t, newClient(t, eps))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	key := "late-refresh-" + time.Now().Format("150405.000000")
	l := testenv.FromKept(ctx, t, a, key, 10*time.Second)
	testenv.RefreshAcrossRelease(ctx, t, l)
	time.Sleep(100 * time.Millisecond) // the refresh's clean-up, if any, has run
	if got, err := b.TryAcquire(ctx, key, 10*time.Second); err == nil {
		got.Release(ctx)
		t.Fatal("the late Refresh's clean-up deleted the kept entry")
	}
	next, err := a.Acquire(ctx, key, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer next.Release(ctx)
	if next.Token() != l.Token() || next.Fence() != l.Fence()+1 {
		t.Errorf("token %q fence %d after token %q fence %d; want the kept entry's next lease",
			next.Token(), next.Fence(), l.Token(), l.Fence())
	}
}

// Fences are 128 × the entry's create revision on every Store, also with
// WithMaxLocalHandOffs(0): two Stores with and without hand-offs taking a
// key in turn hand out rising fences (bare revisions next to scaled ones
// would give a later holder a lower fence, which a fence gate refuses).
func TestFenceScale(t *testing.T) {
	eps := testenv.EtcdAddrs(t)
	c := newClient(t, eps)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stores := []*etcdstore.Store{newStore(t, c), newStore(t, newClient(t, eps), etcdstore.WithMaxLocalHandOffs(0))}
	key := "scale-" + time.Now().Format("150405.000000")
	var last uint64
	for i := range 6 {
		s := stores[i%2]
		l, err := s.Acquire(ctx, key, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := c.Get(ctx, "oncekit/lock/"+key+"/", clientv3.WithPrefix())
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("entries %v (%v), want one", resp, err)
		}
		if want := uint64(resp.Kvs[0].CreateRevision) * 128; l.Fence() != want {
			t.Errorf("store %d: fence %d, want %d (the entry's create revision × 128)", i%2, l.Fence(), want)
		}
		if l.Fence() <= last {
			t.Errorf("store %d: fence %d after %d", i%2, l.Fence(), last)
		}
		last = l.Fence()
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond) // not hot: each Acquire makes an entry
	}
}
