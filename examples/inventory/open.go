package inventory

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/oncekit/oncekit/core/observe"
	"github.com/oncekit/oncekit/storage"
	"github.com/oncekit/oncekit/storage/etcdstore"
	"github.com/oncekit/oncekit/storage/memstore"
	"github.com/oncekit/oncekit/storage/redisstore"
	"github.com/oncekit/oncekit/storage/redlockstore"
	"github.com/oncekit/oncekit/storage/sqlstore"
	"github.com/oncekit/oncekit/storage/zkstore"
)

// StoreHelp describes the store URLs Open takes (every driver's: this
// package imports them all).
var StoreHelp = storage.Help()

// Open opens the oncekit driver a store URL names (the forms of oncectl:
// memory://, redis://, redis-sentinel://, redis-cluster://,
// redlock://h1,h2,h3, etcd://..., postgres://..., mysql://..., zk://...)
// and the inventory beside it, under prefix: on Redis (one server, a
// Sentinel group or a Cluster), etcd and ZooKeeper the stock lives on the
// records' servers, with Redlock on the first node, on SQL in tables of
// the records' database. obs, if not nil, observes the driver. close
// closes both.
//
// Open returns with the store's connections open (storage.Warmer), as a
// service opens its pool before it reports ready: a sale starts all at
// once, and its first buyers should not wait while connections are opened
// (a server process each on PostgreSQL) and statements prepared.
func Open(url, prefix string, obs observe.Observer) (store Store, backend Backend, close func(), err error) {
	st, err := storage.Open(context.Background(), url, storage.WithObserver(obs))
	if err != nil {
		return nil, nil, nil, err
	}
	switch d := st.(type) {
	case *memstore.Store:
		backend = NewMemory()
	case *redisstore.Store: // one server, a Sentinel group or a Cluster
		backend = NewRedis(d.Client().(redis.UniversalClient), prefix)
	case *redlockstore.Store:
		backend = NewRedisKeyed(d.Clients()[0].(redis.UniversalClient), prefix)
	case *etcdstore.Store:
		backend = NewEtcd(d.Client().(*clientv3.Client), prefix)
	case *zkstore.Store:
		z, err := NewZooKeeper(d.Conn(), prefix)
		if err != nil {
			_ = st.Close()
			return nil, nil, nil, err
		}
		backend = z
	case *sqlstore.Store:
		sq := NewSQL(d.DB(), d.Dialect(), prefix)
		if err := sq.Migrate(context.Background()); err != nil {
			_ = st.Close()
			return nil, nil, nil, err
		}
		backend = sq
	default:
		_ = st.Close()
		return nil, nil, nil, fmt.Errorf("inventory: the example does not run on %s", observe.DriverOf(st))
	}
	if w, ok := st.(storage.Warmer); ok {
		// An optimisation, not a check: a connection the pool could not
		// open now is opened when a request needs it, and that request
		// reports the error (storage.Open has pinged the store already).
		_ = w.Warm(context.Background(), 0)
	}
	return st, backend, func() { _ = st.Close() }, nil
}
