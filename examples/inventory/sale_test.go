package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/observe/promobs"
	"github.com/oncekit/oncekit/storage/memstore"
	"github.com/oncekit/oncekit/storage/redisstore"
)

func TestSaleMemory(t *testing.T) {
	store := memstore.New()
	m, err := lock.NewMutex(store, lock.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	checkSale(t, guard(t, store), m)
}

func guard(t *testing.T, st idem.Store) *idem.Guard {
	g, err := idem.NewGuard(st, idem.WithWait(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// TestSaleRedis runs the sale with buyers spread over four Redis clients,
// as four processes would be.
func TestSaleRedis(t *testing.T) {
	addr := testenv.RedisAddrs(t, 1)[0]
	lockers := make([]lock.Locker, 4)
	var records idem.Store
	for i := range lockers {
		c := redis.NewClient(&redis.Options{Addr: addr})
		t.Cleanup(func() { c.Close() })
		s, err := redisstore.New(c)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		lockers[i], records = s, s
	}
	m, err := lock.NewMutex(&roundRobin{lockers: lockers}, lock.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	checkSale(t, guard(t, records), m)
}

func checkSale(t *testing.T, g *idem.Guard, m *lock.Mutex) {
	t.Helper()
	for _, tc := range []struct{ buyers, stock int }{{200, 50}, {20, 50}, {10, 0}} {
		r := RunSale(t.Context(), g, m, tc.buyers, tc.stock, 2)
		if !r.OK() {
			t.Errorf("buyers %d stock %d:\n%s", tc.buyers, tc.stock, r)
		}
		if r.Sold+r.SoldOut+r.Duplicates != r.Submissions {
			t.Errorf("outcomes %d+%d+%d do not add up to %d submissions", r.Sold, r.SoldOut, r.Duplicates, r.Submissions)
		}
		if r.Duplicates != tc.buyers*2 {
			t.Errorf("%d duplicates replayed, want %d (two per order)", r.Duplicates, tc.buyers*2)
		}
	}
}

// The metrics the demo prints agree with the sale's own outcome: one claim
// per order, every duplicate replayed, nothing lost.
func TestSaleMetrics(t *testing.T) {
	metrics := promobs.New()
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics)
	store := memstore.New(memstore.WithObserver(metrics))
	m, err := lock.NewMutex(store, lock.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	r := RunSale(t.Context(), guard(t, store), m, 100, 30, 2)
	if !r.OK() {
		t.Fatalf("sale failed:\n%s", r)
	}
	want := fmt.Sprintf(`
# HELP oncekit_idem_claims_total Idempotency claims by outcome.
# TYPE oncekit_idem_claims_total counter
oncekit_idem_claims_total{driver="memory",outcome="acquired"} 100
oncekit_idem_claims_total{driver="memory",outcome="replayed"} %d
oncekit_idem_claims_total{driver="memory",outcome="stored"} 100
# HELP oncekit_lock_acquire_total Lock acquisitions by outcome.
# TYPE oncekit_lock_acquire_total counter
oncekit_lock_acquire_total{driver="memory",outcome="acquired"} 100
`, r.Duplicates)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"oncekit_idem_claims_total", "oncekit_lock_acquire_total", "oncekit_lock_lost_total"); err != nil {
		t.Error(err)
	}
}
