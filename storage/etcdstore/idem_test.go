package etcdstore_test

import (
	"context"
	"encoding/binary"
	"errors"
	"time"

	"net/url"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/idem/idemtest"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/storage/etcdstore"
)

func TestIdemConformance(t *testing.T) {
	t.Parallel()
	eps := testenv.EtcdAddrs(t)
	admin := newClient(t, eps)
	idemtest.Run(t, idemtest.Config{
		NewStore:      func(t *testing.T) idemdriver.Store { return newStore(t, newClient(t, eps)) },
		RunnerProcess: true,
		Corrupt: func(t *testing.T, key string) {
			if _, err := admin.Put(context.Background(), "oncekit/idem/"+url.PathEscape(key)+"/planted", "garbage"); err != nil {
				t.Fatal(err)
			}
		},
		Effect: func(t *testing.T, key string, limit int) (any, func() int) {
			// The counter is the version of a key: each applied effect puts it once.
			counter := "idemtest/effect/" + url.PathEscape(key)
			effect := etcdstore.Effect{
				If:     []clientv3.Cmp{clientv3.Compare(clientv3.Version(counter), "<", limit)},
				Then:   []clientv3.Op{clientv3.OpPut(counter, "x")},
				Reason: "limit reached",
			}
			return effect, func() int {
				r, err := admin.Get(context.Background(), counter)
				if err != nil {
					t.Fatal(err)
				}
				if len(r.Kvs) == 0 {
					return 0
				}
				return int(r.Kvs[0].Version)
			}
		},
	})
}

// A claim written by a client whose clock runs an hour behind (its
// recorded expiry is long past by ours) is still in flight for us: etcd
// claims end by their claimer's Store or their session lease, by the
// server's clock, never by comparing another client's clock with ours.
func TestClaimNotTakenOverByClockSkew(t *testing.T) {
	eps := testenv.EtcdAddrs(t)
	admin := newClient(t, eps)
	claimer, other := newStore(t, newClient(t, eps)), newStore(t, newClient(t, eps))
	ctx := t.Context()
	key := "skewed-" + time.Now().Format("150405.000000")
	c, err := claimer.Begin(ctx, idemdriver.MustKey(key), "fp", 30*time.Second)
	if err != nil || c.State != idemdriver.Acquired {
		t.Fatalf("Begin: %v %v", c.State, err)
	}
	// Rewrite the entry's recorded expiry as a client an hour behind would
	// have written it: version, state, expiry (ms), fingerprint length, fp.
	entry := "oncekit/idem/" + url.PathEscape(key) + "/" + c.Token
	g, err := admin.Get(ctx, entry)
	if err != nil || len(g.Kvs) != 1 {
		t.Fatalf("Get the claim's entry: %v", err)
	}
	v := append([]byte(nil), g.Kvs[0].Value...)
	binary.BigEndian.PutUint64(v[2:10], uint64(time.Now().Add(-time.Hour).UnixMilli()))
	if _, err := admin.Put(ctx, entry, string(v), clientv3.WithIgnoreLease()); err != nil {
		t.Fatal(err)
	}
	got, err := other.Begin(ctx, idemdriver.MustKey(key), "fp", 30*time.Second)
	if err != nil || got.State != idemdriver.InFlight {
		t.Fatalf("Begin by another client: %v %v; want in flight (no takeover by comparing clocks)", got.State, err)
	}
	if err := claimer.Abandon(ctx, c); err != nil && !errors.Is(err, lock.ErrLockLost) {
		t.Fatal(err)
	}
}

// An effect whose transaction the server rejects (a key put twice in one
// Txn) fails at once with ErrEffectFailed: it is an answer that a retry
// would repeat, so the Guard neither retries it to the end of the claim's
// lease nor completes the record; the claim is abandoned.
func TestEffectRejectedNotRetried(t *testing.T) {
	eps := testenv.EtcdAddrs(t)
	s := newStore(t, newClient(t, eps))
	g, err := idem.NewGuard(s, idem.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	k := idemdriver.ScopedKey("effect-rejected", time.Now().Format(time.RFC3339Nano))
	dup := "effect-rejected/" + url.PathEscape(k)
	effect := etcdstore.Effect{Then: []clientv3.Op{clientv3.OpPut(dup, "a"), clientv3.OpPut(dup, "b")}}
	start := time.Now()
	_, _, err = g.Do(ctx, k, "fp", func(ctx context.Context) ([]byte, error) {
		return []byte("ok"), idem.Commit(ctx, effect)
	})
	if !errors.Is(err, idem.ErrEffectFailed) {
		t.Fatalf("Do with a rejected effect: %v (after %s), want ErrEffectFailed", err, time.Since(start))
	}
	c, err := s.Begin(ctx, idemdriver.MustKey(k), "fp", time.Second)
	if err != nil || c.State != idemdriver.Acquired {
		t.Fatalf("after a rejected effect the key is %v (%v), want it free (abandoned)", c.State, err)
	}
	_ = s.Abandon(ctx, c)
}

// A claim's validity is bounded by the session lease its entry is bound
// to: a claim taken on a session renewed a while ago expires with that
// session if its keep-alives stop, before its own lease would run out.
// Begin says so in Claim.Expires, which the Guard ends its run by.
func TestClaimValidityBoundedBySession(t *testing.T) {
	s := newStore(t, newClient(t, testenv.EtcdAddrs(t)))
	ctx := t.Context()
	const lease = 2 * time.Second
	k := idemdriver.ScopedKey("session-bound", time.Now().Format(time.RFC3339Nano))
	sent := time.Now()
	c1, err := s.Begin(ctx, idemdriver.MustKey(k+"/1"), "fp", lease) // creates the session of the 2 s class
	if err != nil || c1.State != idemdriver.Acquired {
		t.Fatalf("Begin: %v %v", c1.State, err)
	}
	defer s.Abandon(context.Background(), c1)
	time.Sleep(400 * time.Millisecond) // before the session's first keep-alive (TTL/3)
	c2, err := s.Begin(ctx, idemdriver.MustKey(k+"/2"), "fp", lease)
	if err != nil || c2.State != idemdriver.Acquired {
		t.Fatalf("Begin: %v %v", c2.State, err)
	}
	defer s.Abandon(context.Background(), c2)
	if limit := sent.Add(lease + 100*time.Millisecond); c2.Expires.After(limit) {
		t.Errorf("claim valid until %s after the session was granted; the session lease it is bound to ends by %s",
			c2.Expires.Sub(sent).Round(time.Millisecond), lease)
	}
}
