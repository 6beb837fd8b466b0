package redisstore_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/stock"
	"github.com/oncekit/oncekit/stock/stockdriver"
	"github.com/oncekit/oncekit/stock/stocktest"
	"github.com/oncekit/oncekit/storage/redisstore"
)

// The stock suite on one server (with worker processes), a Cluster and a
// Sentinel deployment whose writes wait for both replicas.
func TestStock(t *testing.T) {
	t.Parallel()
	t.Run("server", func(t *testing.T) {
		t.Parallel()
		stocktest.Run(t, stocktest.Config{
			NewStore: func(t *testing.T) stockdriver.Store { return newStore(t, newClient(t)) },
			Process:  true,
		})
	})
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		addrs := testenv.RedisClusterAddrs(t)
		stocktest.Run(t, stocktest.Config{NewStore: func(t *testing.T) stockdriver.Store {
			c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
			t.Cleanup(func() { _ = c.Close() })
			return newStore(t, c)
		}})
	})
	t.Run("sentinel", func(t *testing.T) {
		t.Parallel()
		sentinels, master := testenv.SentinelAddrs(t)
		stocktest.Run(t, stocktest.Config{NewStore: func(t *testing.T) stockdriver.Store {
			return newStore(t, failoverClient(t, sentinels, master), redisstore.WithReplicas(2, 2*time.Second))
		}})
	})
}

// A record or an item of a layout this version does not read fails the
// call and changes nothing.
func TestStockUnknownLayout(t *testing.T) {
	c := newClient(t)
	st, err := stock.New(newStore(t, c))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	item := t.Name() + time.Now().Format(time.RFC3339Nano)
	if _, err := st.Put(ctx, item, 5); err != nil {
		t.Fatal(err)
	}
	rec := "oncekit:stock:{" + item + "}:k:later"
	if err := c.Set(ctx, rec, "S2|t|s|1|0|1000", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Del(context.Background(), rec, "oncekit:stock:{"+item+"}") })
	if _, err := st.Take(ctx, item, "later", 1); !errors.Is(err, stock.ErrUnknownLayout) || !errors.Is(err, stock.ErrStore) {
		t.Fatalf("Take of a key whose record is a later layout's: %v, want ErrUnknownLayout", err)
	}
	if l, err := st.Level(ctx, item); err != nil || l != (stock.Level{Put: 5, Free: 5}) {
		t.Fatalf("Level = %+v, %v; want nothing changed", l, err)
	}
	if err := c.HSet(ctx, "oncekit:stock:{"+item+"}", "v", "S2").Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Take(ctx, item, "k", 1); !errors.Is(err, stock.ErrUnknownLayout) {
		t.Fatalf("Take of an item of a later layout: %v, want ErrUnknownLayout", err)
	}
}

// The stock layout v0.1.0 wrote (testdata/stock/v0.1.0.json) is
// read as it was meant by this version.
func TestStockLayouts(t *testing.T) {
	c := newClient(t)
	b, err := os.ReadFile("testdata/stock/v0.1.0.json")
	if err != nil {
		t.Fatal(err)
	}
	var g struct {
		Item    map[string]string
		Holds   []string
		Records map[string]string
	}
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	stocktest.CheckLayout(t, newStore(t, c), func(t *testing.T, item string) {
		ctx := context.Background()
		now, err := c.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		deadline := now.Add(time.Hour).UnixMilli()
		name := "oncekit:stock:{" + item + "}"
		if err := c.HSet(ctx, name, g.Item).Err(); err != nil {
			t.Fatal(err)
		}
		for _, k := range g.Holds {
			c.ZAdd(ctx, name+":h", redis.Z{Score: float64(deadline), Member: k})
		}
		for k, v := range g.Records {
			c.Set(ctx, name+":k:"+k, strings.ReplaceAll(v, "{deadline}", strconv.FormatInt(deadline, 10)), time.Hour)
		}
		t.Cleanup(func() { c.Del(context.Background(), name, name+":h") })
	})
}
