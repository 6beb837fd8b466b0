package etcdstore_test

import (
	"context"
	"encoding/json"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/stock/stockdriver"
	"github.com/oncekit/oncekit/stock/stocktest"
	clientv3 "go.etcd.io/etcd/client/v3"
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

// The stock entries v0.1.0 wrote (testdata/stock/v0.1.0.json) are
// read as they were meant by this version.
func TestStockLayouts(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("testdata/stock/v0.1.0.json")
	if err != nil {
		t.Fatal(err)
	}
	var g struct {
		I       string
		Holds   map[string]string
		Records map[string]string
	}
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, testenv.EtcdAddrs(t))
	stocktest.CheckLayout(t, newStore(t, c), func(t *testing.T, item string) {
		ctx := context.Background()
		lease, err := c.Grant(ctx, 3600)
		if err != nil {
			t.Fatal(err)
		}
		dir := "oncekit/stock/" + url.PathEscape(item) + "/"
		ops := []clientv3.Op{clientv3.OpPut(dir+"i", g.I)}
		for k, v := range g.Holds {
			ops = append(ops, clientv3.OpPut(dir+"h/"+k, v, clientv3.WithLease(lease.ID)))
		}
		for k, v := range g.Records {
			ops = append(ops, clientv3.OpPut(dir+"k/"+k, strings.ReplaceAll(v, "{lease}", strconv.FormatInt(int64(lease.ID), 10))))
		}
		if _, err := c.Txn(ctx).Then(ops...).Commit(); err != nil {
			t.Fatal(err)
		}
	})
}
