package all

import (
	_ "github.com/oncekit/oncekit/storage/etcdstore"    // etcd://
	_ "github.com/oncekit/oncekit/storage/memstore"     // memory://
	_ "github.com/oncekit/oncekit/storage/redisstore"   // redis://, rediss://, redis-cluster://, redis-sentinel://
	_ "github.com/oncekit/oncekit/storage/redlockstore" // redlock://
	_ "github.com/oncekit/oncekit/storage/sqlstore"     // postgres://, postgresql://, mysql://
	_ "github.com/oncekit/oncekit/storage/zkstore"      // zk://, zookeeper://
)
