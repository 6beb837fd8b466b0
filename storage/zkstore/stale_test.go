package zkstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/storage/zkstore"
)

// A TryAcquire that begins after another session's Release returned finds
// the key free, also when the two sessions read from different servers of
// the ensemble: a server may not have applied the release yet when it
// answers a read, so a key that looks held is looked at again after a
// sync with the leader before it is reported busy.
func TestTryAcquireAfterReleaseOnAnotherServer(t *testing.T) {
	addrs := testenv.ZooKeeperAddrs(t)
	if len(addrs) < 2 {
		t.Fatalf("needs an ensemble of two servers or more, have %v", addrs)
	}
	connectOne := func(addr string) *zkstore.Store {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s, err := zkstore.Connect(ctx, []string{addr}, zkstore.WithSessionTimeout(sessionTimeout))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	a, b := connectOne(addrs[0]), connectOne(addrs[1])
	ctx := ctxT(t, time.Minute)
	busy := 0
	const rounds = 300
	for i := range rounds {
		key := fmt.Sprintf("stale-%d-%d", time.Now().UnixNano(), i)
		l, err := a.Acquire(ctx, key, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		l2, err := b.TryAcquire(ctx, key, 10*time.Second)
		if err != nil {
			busy++
			continue
		}
		_ = l2.Release(ctx)
	}
	if busy > 0 {
		t.Errorf("%d of %d TryAcquires right after a release on another server found the key busy", busy, rounds)
	}
}
