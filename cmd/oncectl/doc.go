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
// eviction, persistence, replicas and the rights the driver needs on
// Redis, a Sentinel group's failover, a Cluster's slots and replicas, how
// a commit reaches the disk and a transaction pooler on SQL, the session
// a ZooKeeper ensemble grants, members and leaders, round trips and the
// clock — and says for each promise whether it holds on this deployment,
// on what condition, and what to change (docs/operations.md, "Check your
// deployment"). It takes one Redis server, a Sentinel group, a Cluster,
// Redlock's nodes, etcd, ZooKeeper, PostgreSQL and MySQL/MariaDB, and
// answers in under two seconds on a healthy store.
//
// oncectl verify is an acceptance test of the store, bounded by --for:
// worker processes of oncectl's own (it starts its own executable) take
// the locks on a few shared keys and write a fenced register under each
// lease, claim new and duplicate keys with Guard.Do, and one of them is
// killed (SIGKILL) while it holds a key. It reports holds at once whose
// writes were both accepted (must be 0), fences that do not grow, replays
// with another answer than the key's first, whether the claims' history is
// linearizable (porcupine), how long the killed worker's key took to free
// against the TTL, and the latencies of locks, new keys and replays; with
// --html FILE, also a page with the latency histogram and every hold on a
// timeline. It writes only under oncectl-verify/<run>/, and deletes its
// records and frees its locks at the end (the SQL and ZooKeeper stores
// keep a free row or node per lock key as its fence's floor, as they do
// for every key).
//
//	oncectl --store redis://localhost:6379 doctor
//	oncectl --store postgres://db/orders verify --for 30s --html verify.html
//
// Exit status: 0 done, 1 the operation failed or was declined (doctor: a
// promise does not hold; verify: a check failed), 2 bad usage (doctor,
// verify: the store could not be reached).
package main
