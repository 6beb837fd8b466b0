package storage

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/oncekit/oncekit/core/observe"
	"github.com/oncekit/oncekit/storage/driver"
	_ "github.com/oncekit/oncekit/storage/memstore" // memory://, always registered
)

// Help lists the URL forms, for a command's usage text.
const Help = `Store URLs:
  memory://                                      the in-process driver (one process only)
  redis://[user:password@]host:port[/db]         one Redis server (rediss:// for TLS)
  redis-cluster://[user:password@]host:port,...  a Redis Cluster (rediss-cluster:// for TLS)
  redis-sentinel://host:port,...[/db]?master_name=NAME
                                                 a primary managed by Sentinel (the hosts are the sentinels)
  redlock://host:port,host:port,host:port        Redlock over N independent Redis servers
  etcd://host:port,host:port,...                 an etcd cluster
  postgres://user:password@host:port/dbname      PostgreSQL (pgx's parameters: sslmode=...)
  mysql://user:password@host:port/dbname         MySQL 8 or MariaDB (go-sql-driver/mysql's parameters)
  zk://host:port,host:port,...[/root][?session_timeout=10s]
                                                 a ZooKeeper ensemble (znodes under root, default /oncekit)
Credentials: user:password@ before the hosts (a Redis ACL user or requirepass, an etcd user).
Redis forms take go-redis' query parameters (dial_timeout=2s, pool_size=50, ...)
and replicas=N (replica_timeout=1s): every lease and claim waits for N
replicas (redisstore.WithReplicas).
SQL forms create their tables if missing (migrate=false skips that) and
take prefix=P as the table prefix (default oncekit_); TLS through the
driver's own parameters. Behind pgbouncer in transaction mode add
notify=false&default_query_exec_mode=exec. zk:// waits for a session (within the timeout)
and takes no other parameter.
Every other form takes:
  prefix=P          the lock key prefix
  record_prefix=P   the idempotency record prefix
  ca=FILE           PEM certificates to trust; turns TLS on
  cert=FILE key=FILE  a client certificate for TLS`

// Store is what every driver is (the driver.Store contract): a
// lock.Locker and an idem.Store with their inspectors and lister, a health
// check and an observer hook, closed with Close.
type Store = driver.Store

// Warmer is a Store that opens its connections ahead of traffic: the SQL,
// Redis and Redlock drivers, whose pools otherwise open a connection when
// a request first needs it (on PostgreSQL, a server process each, and a
// preparation of each statement). A service calls Warm once, before it
// reports ready, so that the first burst of requests after a quiet start
// — a flash sale's first second — does not pay for them on its critical
// path. n is how many connections (per server); n ≤ 0 lets the driver
// choose (its pool's size). etcd and ZooKeeper keep one connection, open
// after Open, and memory none: they are not Warmers.
type Warmer interface {
	Warm(ctx context.Context, n int) error
}

// Option configures Open.
type Option func(*options)

type options struct {
	timeout  time.Duration
	observer observe.Observer
}

// WithTimeout bounds dialing and each request of the clients Open makes,
// where the URL does not set its own (dial_timeout, read_timeout,
// write_timeout). Default 3 s.
func WithTimeout(d time.Duration) Option { return func(o *options) { o.timeout = d } }

// WithObserver sets the driver's Observer (see package observe). Default
// none.
func WithObserver(obs observe.Observer) Option { return func(o *options) { o.observer = obs } }

// driverPackages names the package that registers each scheme oncekit
// ships, for the error that says which to import.
var driverPackages = map[string]string{
	"redis": "redisstore", "rediss": "redisstore", "redis-cluster": "redisstore", "rediss-cluster": "redisstore",
	"redis-sentinel": "redisstore", "rediss-sentinel": "redisstore",
	"redlock": "redlockstore", "etcd": "etcdstore",
	"postgres": "sqlstore", "postgresql": "sqlstore", "mysql": "sqlstore",
	"zk": "zkstore", "zookeeper": "zkstore",
}

// Open opens the store rawURL names (see the package documentation for the
// forms) with the driver registered for its scheme: import the driver's
// package (or storage/all for every driver) to register it. It makes no
// request the driver does not need: an unreachable server shows on first
// use. ctx bounds the opening itself. The Store returned is the driver's
// own (*redisstore.Store for redis://, …), and its Close also closes the
// clients Open made.
func Open(ctx context.Context, rawURL string, opts ...Option) (Store, error) {
	o := options{timeout: 3 * time.Second}
	for _, opt := range opts {
		opt(&o)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if o.timeout <= 0 {
		return nil, fmt.Errorf("storage: timeout %s is not positive", o.timeout)
	}
	if rawURL == "" {
		return nil, errors.New("storage: no store URL\n" + Help)
	}
	if !strings.Contains(rawURL, "://") {
		return nil, fmt.Errorf("storage: store URL %q has no scheme\n%s", rawURL, Help)
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("storage: store URL: %w", err)
	}
	if u.Scheme == "" {
		return nil, fmt.Errorf("storage: store URL %q has no scheme\n%s", rawURL, Help)
	}
	open, ok := driver.Lookup(u.Scheme)
	if !ok {
		if pkg, known := driverPackages[u.Scheme]; known {
			return nil, fmt.Errorf("storage: store URL scheme %q needs its driver: import _ \"github.com/oncekit/oncekit/storage/%s\" "+
				"(or storage/all for every driver)", u.Scheme, pkg)
		}
		return nil, fmt.Errorf("storage: store URL scheme %q is not supported (registered: %s)\n%s",
			u.Scheme, strings.Join(driver.Schemes(), ", "), Help)
	}
	q := u.Query()
	du := &driver.URL{URL: u, Prefix: q.Get("prefix"), RecordPrefix: q.Get("record_prefix"), Timeout: o.timeout, Observer: o.observer}
	if du.TLS, err = tlsConfig(q.Get("ca"), q.Get("cert"), q.Get("key")); err != nil {
		return nil, fmt.Errorf("storage: store URL: %w", err)
	}
	for _, p := range []string{"prefix", "record_prefix", "ca", "cert", "key"} {
		q.Del(p)
	}
	u.RawQuery = q.Encode()
	du.Query = q
	st, err := open(ctx, du)
	if err != nil {
		return nil, fmt.Errorf("storage: %w", err)
	}
	return st, nil
}

// tlsConfig builds the TLS configuration of the ca, cert and key
// parameters (nil when none is set).
func tlsConfig(ca, cert, key string) (*tls.Config, error) {
	if ca == "" && cert == "" && key == "" {
		return nil, nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, fmt.Errorf("ca: %w", err)
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("ca: %s holds no PEM certificate", ca)
		}
	}
	if (cert == "") != (key == "") {
		return nil, errors.New("cert and key go together")
	}
	if cert != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, fmt.Errorf("client certificate: %w", err)
		}
		c.Certificates = []tls.Certificate{pair}
	}
	return c, nil
}
