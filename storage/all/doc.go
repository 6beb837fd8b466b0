// Package all registers every driver oncekit ships with storage.Open:
//
//	import _ "github.com/oncekit/oncekit/storage/all"
//
// for a program that takes any store URL (a command-line tool, a service
// whose deployment picks the store). A program that uses one store
// imports that driver's package instead and links only its client:
// storage/redisstore (redis://, rediss://, redis-cluster://,
// redis-sentinel://), storage/redlockstore (redlock://),
// storage/etcdstore (etcd://), storage/sqlstore (postgres://, mysql://)
// or storage/zkstore (zk://). The memory driver (storage/memstore,
// memory://) is always registered.
package all
