// Package oncekit makes a piece of work run once per key across many
// processes: distributed locks with fencing tokens (package core/lock)
// and idempotency (package core/idem) on Redis, Redlock, etcd,
// PostgreSQL, MySQL, ZooKeeper or in process (storage/...), with
// middleware for net/http (httpmw), gRPC (grpcmw) and Kafka consumers
// (kafkamw), scheduled jobs (job) and one-replica loops (lead).
//
// This package holds only the version; start with storage.Open, then
// lock.NewMutex or idem.NewGuard, or the middleware.
package oncekit

// Version is the version of oncekit this code is: the release it was
// tagged as, or the release it is being made into. The stored layouts
// each version writes are listed in CONTRIBUTING.md.
const Version = "v0.1.0"
