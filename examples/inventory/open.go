package inventory

import (
	"context"
	"fmt"

	"github.com/oncekit/oncekit/core/observe"
	"github.com/oncekit/oncekit/storage"
	"github.com/oncekit/oncekit/storage/sqlstore"
)

// StoreHelp describes the store URLs Open takes.
const StoreHelp = storage.Help

// Open opens the oncekit driver a store URL names (the forms of oncectl:
// memory://, redis://, redis-sentinel://, redis-cluster://,
// redlock://h1,h2,h3, etcd://..., postgres://..., mysql://..., zk://...)
// and the inventory beside it, under prefix: on Redis (one server, a
// Sentinel group or a Cluster), etcd and ZooKeeper the stock lives on the
// records' servers, with Redlock on the first node, on SQL in tables of
// the records' database. obs, if not nil, observes the driver. close
// closes both.
func Open(url, prefix string, obs observe.Observer) (store Store, backend Backend, close func(), err error) {
	st, err := storage.Open(context.Background(), url, storage.WithObserver(obs))
	if err != nil {
		return nil, nil, nil, err
	}
	switch scheme := storage.Scheme(st); scheme {
	case "memory":
		backend = NewMemory()
	case "redis", "redis-sentinel", "redis-cluster":
		backend = NewRedis(storage.RedisClient(st), prefix)
	case "redlock":
		backend = NewRedisKeyed(storage.RedlockClients(st)[0], prefix)
	case "etcd":
		backend = NewEtcd(storage.EtcdClient(st), prefix)
	case "zk":
		z, err := NewZooKeeper(storage.ZooKeeperConn(st), prefix)
		if err != nil {
			_ = st.Close()
			return nil, nil, nil, err
		}
		backend = z
	case "postgres", "mysql":
		sq := NewSQL(storage.SQLDB(st), sqlstore.Dialect(scheme), prefix)
		if err := sq.Migrate(context.Background()); err != nil {
			_ = st.Close()
			return nil, nil, nil, err
		}
		backend = sq
	default:
		_ = st.Close()
		return nil, nil, nil, fmt.Errorf("inventory: the example does not run on %s://", scheme)
	}
	return st, backend, func() { _ = st.Close() }, nil
}
