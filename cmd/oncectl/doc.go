// Command oncectl inspects and repairs oncekit locks and idempotency
// records in a running deployment, over the same drivers the services use
// (lockdriver.Inspector and idemdriver.Inspector).
//
//	oncectl --store redis://localhost:6379 lock inspect sku-42
//	oncectl --store redis://localhost:6379 lock release sku-42 --force
//	oncectl --store etcd://10.0.0.1:2379 record get REQUEST-KEY --scope tenant-7
//	oncectl --store redlock://r1:6379,r2:6379,r3:6379 record delete REQUEST-KEY --yes
//	oncectl --store postgres://db/orders record list --in-flight
//
// The store comes from --store or $ONCEKIT_STORE (any storage.Open URL:
// redis://, rediss://, redis-cluster://, redis-sentinel://, redlock://,
// etcd://, postgres://, mysql://, zk://), with ?prefix= and
// ?record_prefix= for stores configured with other prefixes. Output is a
// table, or JSON with --json. Releasing a lock and deleting a record ask
// for confirmation unless --yes is given; releasing also needs --force.
//
// Record keys are given the way clients send them, and oncectl derives
// the stored key as the middleware did: idemdriver.ScopedKey(--scope, KEY) for
// httpmw; with --grpc-method /pkg.Service/Method for grpcmw; with
// --kafka-group and --kafka-topic for kafkamw's default scope; --place for
// a placed record (WithPlacement). Pass --stored to give the stored key
// ("idem:...") itself. record list walks the store's records (idemdriver.Lister;
// --in-flight for the claims still running or stuck, --limit to bound it).
// oncectl version prints the build's module version.
//
// oncectl doctor reads the settings each of oncekit's promises rests on —
// eviction, persistence and replicas on Redis, how a commit reaches the
// disk and a transaction pooler on SQL, round trips and the clock — and
// says for each promise whether it holds on this deployment, on what
// condition, and what to change (docs/operations.md, "Check your
// deployment"). It checks one Redis server (or a Sentinel group's
// primary), Redlock's nodes, etcd, ZooKeeper, PostgreSQL and MySQL/MariaDB
// so far.
//
// Exit status: 0 done, 1 the operation failed or was declined (doctor: a
// promise does not hold), 2 bad usage (doctor: the store could not be
// reached or has no checks yet).
package main
