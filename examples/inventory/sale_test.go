package main

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/storage/memstore"
	"github.com/oncekit/oncekit/storage/redisstore"
)

func TestSaleMemory(t *testing.T) {
	m, err := lock.NewMutex(memstore.New(), lock.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	checkSale(t, m)
}

// TestSaleRedis runs the sale with buyers spread over four Redis clients,
// as four processes would be.
func TestSaleRedis(t *testing.T) {
	addr := testenv.RedisAddrs(t, 1)[0]
	lockers := make([]lock.Locker, 4)
	for i := range lockers {
		c := redis.NewClient(&redis.Options{Addr: addr})
		t.Cleanup(func() { c.Close() })
		s, err := redisstore.New(c)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		lockers[i] = s
	}
	m, err := lock.NewMutex(&roundRobin{lockers: lockers}, lock.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	checkSale(t, m)
}

func checkSale(t *testing.T, m *lock.Mutex) {
	t.Helper()
	for _, tc := range []struct{ buyers, stock int }{{200, 50}, {20, 50}, {10, 0}} {
		r := RunSale(t.Context(), m, tc.buyers, tc.stock, 2)
		if !r.OK() {
			t.Errorf("buyers %d stock %d:\n%s", tc.buyers, tc.stock, r)
		}
		if r.Sold+r.SoldOut+r.Duplicates != r.Submissions {
			t.Errorf("outcomes %d+%d+%d do not add up to %d submissions", r.Sold, r.SoldOut, r.Duplicates, r.Submissions)
		}
	}
}
