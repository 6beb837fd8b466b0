package memstore_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/idem/idemtest"
	"github.com/oncekit/oncekit/storage/memstore"
)

func TestIdemConformance(t *testing.T) {
	t.Parallel()
	store := memstore.New()
	idemtest.Run(t, idemtest.Config{
		NewStore: func(*testing.T) idemdriver.Store { return store },
		Effect: func(t *testing.T, key string, limit int) (any, func() int) {
			var mu sync.Mutex // the effect runs under the store's lock; count does not
			n := 0
			effect := memstore.Effect(func() error {
				mu.Lock()
				defer mu.Unlock()
				if n >= limit {
					return errors.New("limit reached")
				}
				n++
				return nil
			})
			return effect, func() int { mu.Lock(); defer mu.Unlock(); return n }
		},
	})
}

// Records are bounded in count and bytes: the records completed longest
// ago go first; in-flight claims are never evicted, and when they alone
// fill the Store, Begin fails with ErrFull.
func TestRecordsBounded(t *testing.T) {
	ctx := t.Context()
	s := memstore.New(memstore.WithMaxRecords(3), memstore.WithMaxBytes(10))
	complete := func(key string, result string) {
		t.Helper()
		c, err := s.Begin(ctx, idemdriver.MustKey(key), "fp", time.Minute)
		if err != nil || c.State != idemdriver.Acquired {
			t.Fatalf("Begin(%s): %v %v", key, c.State, err)
		}
		if err := s.Complete(ctx, c, []byte(result), time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	state := func(key string) idemdriver.State {
		t.Helper()
		info, err := s.InspectRecord(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if !info.Found {
			return -1
		}
		return info.State
	}
	complete("a", "1234")
	complete("b", "1234")
	complete("c", "1234") // 12 bytes > 10: a goes
	if state("a") != -1 || state("b") != idemdriver.Completed || state("c") != idemdriver.Completed {
		t.Fatalf("after the byte bound: a %v b %v c %v; want a evicted", state("a"), state("b"), state("c"))
	}
	var claims []idemdriver.Claim
	for _, k := range []string{"x", "y", "z"} { // in flight: b and c make room
		c, err := s.Begin(ctx, idemdriver.MustKey(k), "fp", time.Minute)
		if err != nil || c.State != idemdriver.Acquired {
			t.Fatalf("Begin(%s): %v %v", k, c.State, err)
		}
		claims = append(claims, c)
	}
	if state("b") != -1 || state("c") != -1 {
		t.Fatal("completed records kept while in-flight claims needed the room")
	}
	if _, err := s.Begin(ctx, idemdriver.MustKey("w"), "fp", time.Minute); !errors.Is(err, memstore.ErrFull) {
		t.Fatalf("Begin with the Store full of in-flight claims: %v, want ErrFull", err)
	}
	for _, c := range claims {
		if state(c.Key.String()) != idemdriver.InFlight {
			t.Fatalf("in-flight claim %s was evicted", c.Key)
		}
	}
}

// A result larger than WithMaxBytes is refused before the effect applies:
// stored, it would be evicted at once and a retry would apply the effect
// again. The Guard reports ErrResultTooLarge and abandons the claim.
func TestResultOverMaxBytesRefusedBeforeEffect(t *testing.T) {
	ctx := t.Context()
	s := memstore.New(memstore.WithMaxBytes(8))
	g, err := idem.NewGuard(s)
	if err != nil {
		t.Fatal(err)
	}
	applied := 0
	for try := range 2 {
		_, _, err := g.Do(ctx, "big", "fp", func(ctx context.Context) ([]byte, error) {
			return []byte("a result of more than eight bytes"), idem.Commit(ctx, memstore.Effect(func() error { applied++; return nil }))
		})
		if !errors.Is(err, idem.ErrResultTooLarge) {
			t.Fatalf("try %d: %v, want ErrResultTooLarge", try, err)
		}
	}
	if applied != 0 {
		t.Errorf("the effect applied %d times for a result the store cannot keep, want 0", applied)
	}
	c, err := s.Begin(ctx, idemdriver.MustKey("big"), "fp", time.Minute)
	if err != nil || c.State != idemdriver.Acquired {
		t.Fatalf("after a refused result the key is %v (%v), want it free", c.State, err)
	}
}
