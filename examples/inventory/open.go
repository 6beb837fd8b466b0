package inventory

import (
	"fmt"

	"github.com/oncekit/oncekit/core/observe"
	"github.com/oncekit/oncekit/internal/storeurl"
)

// StoreHelp describes the store URLs Open takes.
const StoreHelp = storeurl.Help

// Open opens the oncekit driver a store URL names (the forms of oncectl:
// memory://, redis://, redlock://h1,h2,h3, etcd://...) and the inventory
// beside it, under prefix: on Redis and etcd the stock lives on the
// records' servers; with Redlock on the first node. obs, if not nil,
// observes the driver. close closes both.
func Open(url, prefix string, obs observe.Observer) (store Store, backend Backend, close func(), err error) {
	o, err := storeurl.Open(url, storeurl.Options{Observer: obs})
	if err != nil {
		return nil, nil, nil, err
	}
	switch o.Scheme {
	case "memory":
		backend = NewMemory()
	case "redis", "rediss":
		backend = NewRedis(o.Redis, prefix)
	case "redlock":
		backend = NewRedisKeyed(o.Redlock[0], prefix)
	case "etcd":
		backend = NewEtcd(o.Etcd, prefix)
	default:
		o.Close()
		return nil, nil, nil, fmt.Errorf("inventory: the example does not run on %s:// (its stock keys and records would not share a slot)", o.Scheme)
	}
	return o.Store, backend, o.Close, nil
}
