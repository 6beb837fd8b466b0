package etcdstore_test

import (
	"context"

	"net/url"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemtest"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/storage/etcdstore"
)

func TestIdemConformance(t *testing.T) {
	eps := testenv.EtcdAddrs(t)
	admin := newClient(t, eps)
	idemtest.Run(t, idemtest.Config{
		NewStore: func(t *testing.T) idem.Store { return newStore(t, newClient(t, eps)) },
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
