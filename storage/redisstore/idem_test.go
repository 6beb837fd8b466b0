package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemtest"
)

func TestIdemConformance(t *testing.T) {
	admin := newClient(t)
	idemtest.Run(t, idemtest.Config{
		NewStore: func(t *testing.T) idem.Store { return newStore(t, newClient(t)) },
		Corrupt: func(t *testing.T, key string) {
			// Not a record: a plain string under the record's name.
			if err := admin.Set(context.Background(), "oncekit:idem:{"+key+"}", "garbage", time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
		},
	})
}

// Begin of a new key and Complete are one round trip each; a replay is one.
func TestIdemRoundTrips(t *testing.T) {
	var rt counter
	s := newStore(t, newClient(t, &rt))
	g, err := idem.NewGuard(s)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	k := idem.ScopedKey("rt", time.Now().Format(time.RFC3339Nano))
	warm := idem.ScopedKey("rt-warm", time.Now().Format(time.RFC3339Nano))
	if _, _, err := g.Do(ctx, warm, "fp", func(context.Context) ([]byte, error) { return []byte("w"), nil }); err != nil {
		t.Fatal(err) // loads the scripts
	}
	for _, tc := range []struct {
		name string
		want int64
	}{{"new key", 2}, {"replay", 1}} {
		before := rt.N.Load()
		if _, _, err := g.Do(ctx, k, "fp", func(context.Context) ([]byte, error) { return []byte("r"), nil }); err != nil {
			t.Fatal(err)
		}
		if n := rt.N.Load() - before; n != tc.want {
			t.Errorf("Do for a %s made %d round trips, want %d", tc.name, n, tc.want)
		}
	}
}
