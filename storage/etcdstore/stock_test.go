package etcdstore_test

import (
	"testing"
	"time"

	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/stock/stockdriver"
	"github.com/oncekit/oncekit/stock/stocktest"
)

// A hold's end is its lease's: its TTL rounded up to whole seconds, at
// least etcd's minimum TTL (about 2 s), revoked by the leader's lessor
// (which looks every 500 ms).
func TestStock(t *testing.T) {
	t.Parallel()
	eps := testenv.EtcdAddrs(t)
	stocktest.Run(t, stocktest.Config{
		NewStore: func(t *testing.T) stockdriver.Store { return newStore(t, newClient(t, eps)) },
		Process:  true,
		Lag:      3 * time.Second,
	})
}
