package inventory

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/oncekit/oncekit/core/observe"
	"github.com/oncekit/oncekit/stock"
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
// and the inventory beside it, under prefix: the stock in package stock
// on the store (with Redlock, on its first server), the orders, outbox
// and shipments beside the records — on SQL in tables of the records'
// database. obs, if not nil, observes the driver. close
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
	closeKeeper := func() {}
	fail := func(err error) (Store, Backend, func(), error) {
		closeKeeper()
		_ = st.Close()
		return nil, nil, nil, err
	}
	// The stock: package stock on the store itself, or — Redlock keeps
	// none (its quorum cannot keep one count) — on its first server.
	var keeper any = st
	if d, ok := st.(*redlockstore.Store); ok {
		rs, err := redisstore.New(d.Clients()[0].(redis.UniversalClient))
		if err != nil {
			return fail(err)
		}
		keeper, closeKeeper = rs, func() { _ = rs.Close() }
	}
	sales, err := stock.New(keeper, stock.WithObserver(obs))
	if err != nil {
		return fail(err)
	}
	stocked := NewStocked(sales, prefix)
	switch d := st.(type) {
	case *memstore.Store:
		backend = NewMemory(stocked)
	case *redisstore.Store: // one server, a Sentinel group or a Cluster
		backend = NewRedis(stocked, d.Client().(redis.UniversalClient), prefix)
	case *redlockstore.Store:
		backend = NewRedisKeyed(stocked, d.Clients()[0].(redis.UniversalClient), prefix)
	case *etcdstore.Store:
		backend = NewEtcd(stocked, d.Client().(*clientv3.Client), prefix)
	case *zkstore.Store:
		z, err := NewZooKeeper(stocked, d.Conn(), prefix)
		if err != nil {
			return fail(err)
		}
		backend = z
	case *sqlstore.Store:
		sq := NewSQL(stocked, d.DB(), d.Dialect(), prefix)
		if err := sq.Migrate(context.Background()); err != nil {
			return fail(err)
		}
		backend = sq
	default:
		return fail(fmt.Errorf("inventory: the example does not run on %s", observe.DriverOf(st)))
	}
	if w, ok := st.(storage.Warmer); ok {
		// An optimisation, not a check: a connection the pool could not
		// open now is opened when a request needs it, and that request
		// reports the error (storage.Open has pinged the store already).
		_ = w.Warm(context.Background(), 0)
	}
	return st, backend, func() { closeKeeper(); _ = st.Close() }, nil
}
