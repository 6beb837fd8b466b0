package redisstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemtest"
	"github.com/oncekit/oncekit/storage/redisstore"

	"github.com/redis/go-redis/v9"
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
		Effect: redisEffect(admin),
	})
}

// countUpTo is an effect: add one to KEYS[1] unless it reached ARGV[1].
var countUpTo = redisstore.NewEffectScript(`
  local n = tonumber(redis.call('GET', KEYS[1]) or '0')
  if n >= tonumber(ARGV[1]) then return 'limit reached' end
  redis.call('INCR', KEYS[1])
  redis.call('PEXPIRE', KEYS[1], 60000)
`)

func redisEffect(admin redis.UniversalClient) func(t *testing.T, key string, limit int) (any, func() int) {
	return func(t *testing.T, key string, limit int) (any, func() int) {
		counter := redisstore.EffectKey(key, "idemtest:effect:")
		return redisstore.Effect{Script: countUpTo, Keys: []string{counter}, Args: []any{limit}}, func() int {
			n, err := admin.Get(context.Background(), counter).Int()
			if err != nil && !errors.Is(err, redis.Nil) {
				t.Fatal(err)
			}
			return n
		}
	}
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
