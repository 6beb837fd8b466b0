package etcdstore_test

import (
	"context"
	"net/url"
	"testing"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemtest"
	"github.com/oncekit/oncekit/internal/testenv"
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
	})
}
