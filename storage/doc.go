// Package storage opens any oncekit driver from a URL, one form for every
// store: what configuration files, flags and environment variables hold.
//
//	import _ "github.com/oncekit/oncekit/storage/all" // every driver; or only the one you use
//
//	st, err := storage.Open(ctx, os.Getenv("ONCEKIT_STORE")) // e.g. "redis://127.0.0.1:6379"
//	if err != nil { ... }
//	defer st.Close()
//	guard, err := idem.NewGuard(st)       // st is an idemdriver.Store
//	mutex, err := lock.NewMutex(st)       // and a lock.Locker
//
// Drivers register their schemes when their package is imported, as
// database/sql drivers do, so a program links only the clients of the
// drivers it imports: storage/redisstore (redis://, rediss:// and their
// -cluster and -sentinel forms), storage/redlockstore (redlock://),
// storage/etcdstore (etcd://), storage/sqlstore (postgres://, mysql://),
// storage/zkstore (zk://), or storage/all for all of them. memory://
// (storage/memstore) is always there. A URL whose driver was not imported
// fails with an error that lists the schemes the program has and says to
// import the driver's package. Each driver registers its schemes and its
// lines of Help (driver.Info): adding a driver is its folder and one line
// in storage/all.
//
// The forms:
//
//	memory://                                      the in-process driver (this process only)
//	redis://[user:password@]host:port[/db]         one Redis server (rediss:// for TLS)
//	redis-cluster://[user:password@]host:port,...  a Redis Cluster (rediss-cluster:// for TLS)
//	redis-sentinel://[user:password@]host:port,...[/db]?master_name=NAME
//	                                               a primary managed by Redis Sentinel (the hosts are the sentinels)
//	redlock://[user:password@]host:port,host:port,host:port
//	                                               Redlock over N independent Redis servers
//	etcd://[user:password@]host:port,...           an etcd cluster
//	postgres://user:password@host:port/dbname      PostgreSQL (pgx's parameters: sslmode=...)
//	mysql://user:password@host:port/dbname         MySQL 8 or MariaDB (go-sql-driver/mysql's parameters)
//	zk://host:port,...[/root][?session_timeout=10s] a ZooKeeper ensemble (znodes under root, default /oncekit)
//
// The SQL forms create their tables if missing (migrate=false skips that)
// and take prefix=P as the table prefix (default oncekit_); behind
// pgbouncer in transaction mode, add notify=false&default_query_exec_mode=exec
// (see package sqlstore).
//
// The Redis forms are go-redis' own (redis.ParseURL, ParseClusterURL,
// ParseFailoverURL), written with the hosts comma-separated: every option
// go-redis takes as a query parameter works (dial_timeout=2s,
// pool_size=50, …), and an unknown one is an error. oncekit's own
// parameters, on every form: prefix=P (the lock key prefix), record_prefix=P
// (the idempotency record prefix), and for TLS ca=FILE (PEM certificates to
// trust; it turns TLS on), cert=FILE and key=FILE (a client certificate).
//
// The Store returned is the driver's own (*redisstore.Store for the Redis
// forms, *redlockstore.Store, *etcdstore.Store, *sqlstore.Store,
// *zkstore.Store, *memstore.Store), with all its methods and capabilities,
// and its Close also closes the clients Open made. Those clients are the
// driver's Client (redisstore, etcdstore), Clients (redlockstore), DB
// (sqlstore) and Conn (zkstore), for an application that keeps its own
// data beside the driver's. The drivers with a pool of connections (SQL,
// Redis, Redlock) are Warmers: a service calls Warm once, before it
// reports ready, so that its first burst of requests does not open them.
// Every driver closes alike: after Close,
// TryAcquire, Acquire and Begin fail with an error matching
// lock.ErrClosed, an Acquire waiting for a key gives up with it, a lease
// taken before can still be released (on a driver whose connection Close
// ended, it expires by its TTL instead), and a second Close returns nil;
// both conformance suites check it.
package storage
