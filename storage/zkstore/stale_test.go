package zkstore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/lock"
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
	busy, unanswered := 0, 0
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
		switch {
		case errors.Is(err, lock.ErrNotAcquired):
			busy++
			continue
		case err != nil:
			// Not the stale read this test is about: a request that did
			// not answer in time on a loaded machine, say.
			unanswered++
			t.Logf("round %d: %v", i, err)
			continue
		}
		_ = l2.Release(ctx)
	}
	if busy > 0 {
		t.Errorf("%d of %d TryAcquires right after a release on another server found the key busy", busy, rounds)
	}
	if unanswered > rounds/10 {
		t.Errorf("%d of %d TryAcquires failed", unanswered, rounds)
	}
}

// A claim found lost (another Begin took its record over once its lease
// had ended) leaves nothing behind in the Store that held it, whichever
// way its holder learns it: Extend, Complete or CompleteWith.
func TestLostClaimForgotten(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	for _, finish := range []string{"extend", "complete", "complete-with"} {
		t.Run(finish, func(t *testing.T) {
			holder, other := connect(t), connect(t)
			key := "lost-claim-" + finish + "-" + time.Now().Format(time.RFC3339Nano)
			c, err := holder.Begin(ctx, idemdriver.MustKey(key), "fp", 100*time.Millisecond)
			if err != nil || c.State != idemdriver.Acquired {
				t.Fatalf("Begin: %+v %v", c, err)
			}
			if n := zkstore.CachedVersions(holder); n != 1 {
				t.Fatalf("%d cached versions while the claim is held, want 1", n)
			}
			var c2 idemdriver.Claim
			for c2.State != idemdriver.Acquired {
				time.Sleep(50 * time.Millisecond)
				if c2, err = other.Begin(ctx, idemdriver.MustKey(key), "fp", time.Minute); err != nil {
					t.Fatal(err)
				}
			}
			switch finish {
			case "extend":
				err = holder.Extend(ctx, c, time.Minute)
			case "complete":
				err = holder.Complete(ctx, c, []byte("late"), time.Minute)
			default:
				err = holder.CompleteWith(ctx, c, []byte("late"), time.Minute, zkstore.Effect{})
			}
			if !errors.Is(err, lock.ErrLockLost) {
				t.Fatalf("%s of the lost claim: %v, want ErrLockLost", finish, err)
			}
			if n := zkstore.CachedVersions(holder); n != 0 {
				t.Errorf("%d cached versions after the claim was found lost, want 0", n)
			}
		})
	}
}
