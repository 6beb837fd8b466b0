package etcdstore_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/storage/etcdstore"
)

// A claim whose lease runs out without an Extend is deleted by its Store
// even when the first attempt fails (here the request is failed as a
// leader election fails it): left in flight, it would answer every retry
// of its key "in flight" for as long as the claimer's process lives, its
// session being kept alive.
func TestExpiredClaimDeletedAfterFailedAttempt(t *testing.T) {
	eps := testenv.EtcdAddrs(t)
	var failed atomic.Int32
	// Fails the first conditional delete (the claim's expiry) once.
	failFirst := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
		invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if tr, ok := req.(*etcdserverpb.TxnRequest); ok && len(tr.Compare) == 1 &&
			tr.Compare[0].Target == etcdserverpb.Compare_MOD && len(tr.Success) == 1 &&
			tr.Success[0].GetRequestDeleteRange() != nil && failed.CompareAndSwap(0, 1) {
			return status.Error(codes.Unavailable, "etcdserver: leader changed")
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	c, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second,
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(failFirst)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	s := newStore(t, c)
	other := newStore(t, newClient(t, eps))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	key := "expired-claim-" + time.Now().Format("150405.000000")

	claim, err := s.Begin(ctx, idemdriver.MustKey(key), "fp", time.Second)
	if err != nil || claim.State != idemdriver.Acquired {
		t.Fatalf("Begin: %+v %v", claim, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		next, err := other.Begin(ctx, idemdriver.MustKey(key), "fp", time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if next.State == idemdriver.Acquired {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("9 s after the claim's 1 s lease ran out, Begin still finds it %v", next.State)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if failed.Load() != 1 {
		t.Fatal("no delete was failed: the test proved nothing")
	}
}

// A Begin whose transaction commits but whose answer is lost (the
// connection cut after the request reached the servers, here the reply
// replaced by an error) leaves no claim behind that nobody will finish:
// the entry lives with its session, which the Store keeps alive, so before
// it answered every retry of the key "in flight" for as long as the
// process lived. The next Begin claims the key, its attempt counting the
// lost claim.
func TestLostBeginAnswerLeavesNoClaim(t *testing.T) {
	s, other, failed := loseOneAnswer(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	key := idemdriver.MustKey("lost-begin-answer-" + time.Now().Format("150405.000000"))

	if _, err := s.Begin(ctx, key, "fp", 2*time.Second); err == nil {
		t.Fatal("Begin whose answer was lost succeeded")
	}
	if failed.Load() != 1 {
		t.Fatal("no Begin answer was lost: the test proved nothing")
	}
	deadline := time.Now().Add(6 * time.Second) // three leases
	for {
		next, err := other.Begin(ctx, key, "fp", time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if next.State == idemdriver.Acquired {
			if next.Attempt < 2 {
				t.Errorf("attempt %d after a lost claim, want 2 or more", next.Attempt)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("6 s after a Begin whose answer was lost, Begin still finds the key %v", next.State)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// The lock's twin of TestLostBeginAnswerLeavesNoClaim: an Acquire whose
// transaction commits but whose answer is lost leaves no entry holding the
// key for nobody.
func TestLostAcquireAnswerLeavesNoHolder(t *testing.T) {
	s, other, failed := loseOneAnswer(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	key := "lost-acquire-answer-" + time.Now().Format("150405.000000")

	if l, err := s.TryAcquire(ctx, key, 2*time.Second); err == nil {
		_ = l.Release(ctx)
		t.Fatal("TryAcquire whose answer was lost succeeded")
	}
	if failed.Load() != 1 {
		t.Fatal("no Acquire answer was lost: the test proved nothing")
	}
	deadline := time.Now().Add(6 * time.Second) // three TTLs
	for {
		l, err := other.TryAcquire(ctx, key, time.Second)
		if err == nil {
			_ = l.Release(ctx)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("6 s after an Acquire whose answer was lost, TryAcquire still fails: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// loseOneAnswer returns a Store whose client loses the answer of the first
// transaction that creates an entry with ops operations (a Begin: 2, its
// put and the attempt count; an Acquire: 1) after the servers applied it —
// the connection cut after the request was sent — with the number of
// answers lost so far; and a Store on a client of its own.
func loseOneAnswer(t *testing.T, ops int) (*etcdstore.Store, *etcdstore.Store, *atomic.Int32) {
	eps := testenv.EtcdAddrs(t)
	failed := new(atomic.Int32)
	loseAnswer := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
		invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if tr, ok := req.(*etcdserverpb.TxnRequest); ok && err == nil && len(tr.Compare) == 1 &&
			tr.Compare[0].Target == etcdserverpb.Compare_CREATE && len(tr.Success) == ops &&
			tr.Success[0].GetRequestPut() != nil && failed.CompareAndSwap(0, 1) {
			return status.Error(codes.Unavailable, "connection lost after the request was sent")
		}
		return err
	}
	c, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second,
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(loseAnswer)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return newStore(t, c), newStore(t, newClient(t, eps)), failed
}
