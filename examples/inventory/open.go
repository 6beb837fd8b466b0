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
	switch d := st.(type) {
	case *memstore.Store:
		backend = NewMemory()
	case *redisstore.Store: // one server, a Sentinel group or a Cluster
		c := d.Client().(redis.UniversalClient)
		warmRedis(context.Background(), c)
		backend = NewRedis(c, prefix)
	case *redlockstore.Store:
		for _, c := range d.Clients() {
			warmRedis(context.Background(), c.(redis.UniversalClient))
		}
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
		if err := d.Warm(context.Background(), 0); err != nil {
			_ = st.Close()
			return nil, nil, nil, err
		}
	default:
		_ = st.Close()
		return nil, nil, nil, fmt.Errorf("inventory: the example does not run on %s", observe.DriverOf(st))
	}
	return st, backend, func() { _ = st.Close() }, nil
}

// warmRedisConns is how many connections warmRedis opens per server: most
// of go-redis' default pool (10 per CPU).
const warmRedisConns = 16

// warmRedis opens warmRedisConns connections of c's pool, of each shard's
// on a Cluster, and hands them back idle. Best effort: a server that does
// not answer is asked again by the first request.
func warmRedis(ctx context.Context, c redis.UniversalClient) {
	switch c := c.(type) {
	case *redis.Client:
		conns := make([]*redis.Conn, 0, warmRedisConns)
		for range warmRedisConns {
			cn := c.Conn()
			conns = append(conns, cn)
			if cn.Ping(ctx).Err() != nil {
				break
			}
		}
		for _, cn := range conns {
			_ = cn.Close()
		}
	case *redis.ClusterClient:
		_ = c.ForEachShard(ctx, func(ctx context.Context, sc *redis.Client) error {
			warmRedis(ctx, sc)
			return nil
		})
	}
}
