package storage

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/observe"
	"github.com/oncekit/oncekit/storage/etcdstore"
	"github.com/oncekit/oncekit/storage/memstore"
	"github.com/oncekit/oncekit/storage/redisstore"
	"github.com/oncekit/oncekit/storage/redlockstore"
	"github.com/oncekit/oncekit/storage/sqlstore"
	"github.com/oncekit/oncekit/storage/zkstore"
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

// Store is what every driver is: a lock.Locker and an idem.Store with
// their inspectors, a health check, closed with Close.
type Store interface {
	lock.Locker
	idem.Store
	lock.Inspector
	idem.Inspector
	// Ping reports whether the store can serve now, for a readiness
	// probe: one request to the server (to every Redlock node, healthy
	// with a majority).
	Ping(ctx context.Context) error
	Close() error
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

// Open opens the store rawURL names (see the package documentation for the
// forms). It makes no request: an unreachable server shows on first use.
// ctx bounds the opening itself.
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
	q := u.Query()
	c := common{prefix: q.Get("prefix"), recordPrefix: q.Get("record_prefix"), opts: o}
	if c.tls, err = tlsConfig(q.Get("ca"), q.Get("cert"), q.Get("key")); err != nil {
		return nil, fmt.Errorf("storage: store URL: %w", err)
	}
	if v := q.Get("replicas"); v != "" {
		if !strings.HasPrefix(u.Scheme, "redis") && !strings.HasPrefix(u.Scheme, "rediss") {
			return nil, fmt.Errorf("storage: store URL %q: replicas= is for redis forms", u.Redacted())
		}
		if c.replicas, err = strconv.Atoi(v); err != nil || c.replicas < 1 {
			return nil, fmt.Errorf("storage: store URL %q: replicas=%s is not a count of at least 1", u.Redacted(), v)
		}
		c.replicaTimeout = time.Second
		if v := q.Get("replica_timeout"); v != "" {
			if c.replicaTimeout, err = time.ParseDuration(v); err != nil || c.replicaTimeout <= 0 {
				return nil, fmt.Errorf("storage: store URL %q: replica_timeout=%s is not a positive duration", u.Redacted(), v)
			}
		}
	}
	for _, p := range []string{"prefix", "record_prefix", "ca", "cert", "key", "replicas", "replica_timeout"} {
		q.Del(p)
	}
	u.RawQuery = q.Encode()
	switch u.Scheme {
	case "memory", "mem":
		if u.Host != "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
			return nil, fmt.Errorf("storage: store URL %q: memory:// takes no host, path or parameter", rawURL)
		}
		return memstore.New(memstore.WithObserver(o.observer)), nil
	case "redis", "rediss":
		opt, err := redis.ParseURL(u.String())
		if err != nil {
			return nil, fmt.Errorf("storage: store URL: %w", err)
		}
		c.tune(q, knobs{&opt.DialTimeout, &opt.ReadTimeout, &opt.WriteTimeout, &opt.MaxRetries, &opt.DialerRetries, &opt.ContextTimeoutEnabled})
		opt.TLSConfig = c.withTLS(opt.TLSConfig)
		return c.redis(u.Scheme, redis.NewClient(opt))
	case "redis-cluster", "rediss-cluster":
		gu, err := goRedisForm(u, strings.TrimSuffix(u.Scheme, "-cluster"))
		if err != nil {
			return nil, err
		}
		opt, err := redis.ParseClusterURL(gu)
		if err != nil {
			return nil, fmt.Errorf("storage: store URL: %w", err)
		}
		c.tune(q, knobs{&opt.DialTimeout, &opt.ReadTimeout, &opt.WriteTimeout, &opt.MaxRetries, &opt.DialerRetries, &opt.ContextTimeoutEnabled})
		opt.TLSConfig = c.withTLS(opt.TLSConfig)
		return c.redis(u.Scheme, redis.NewClusterClient(opt))
	case "redis-sentinel", "rediss-sentinel":
		gu, err := goRedisForm(u, strings.TrimSuffix(u.Scheme, "-sentinel"))
		if err != nil {
			return nil, err
		}
		opt, err := redis.ParseFailoverURL(gu)
		if err != nil {
			return nil, fmt.Errorf("storage: store URL: %w", err)
		}
		if opt.MasterName == "" {
			return nil, fmt.Errorf("storage: store URL %q: redis-sentinel:// needs master_name=NAME", rawURL)
		}
		c.tune(q, knobs{&opt.DialTimeout, &opt.ReadTimeout, &opt.WriteTimeout, &opt.MaxRetries, &opt.DialerRetries, &opt.ContextTimeoutEnabled})
		opt.TLSConfig = c.withTLS(opt.TLSConfig)
		return c.redis(u.Scheme, redis.NewFailoverClient(opt))
	case "redlock":
		return c.redlock(u, q)
	case "etcd":
		return c.etcd(u)
	case "zk", "zookeeper":
		return c.zk(ctx, u)
	case "postgres", "postgresql", "mysql":
		return c.sql(ctx, u, q)
	case "":
		return nil, fmt.Errorf("storage: store URL %q has no scheme\n%s", rawURL, Help)
	}
	return nil, fmt.Errorf("storage: store URL scheme %q is not supported\n%s", u.Scheme, Help)
}

// common is what every form shares.
type common struct {
	prefix, recordPrefix string
	replicas             int // redis forms: WithReplicas
	replicaTimeout       time.Duration
	tls                  *tls.Config
	opts                 options
}

// knobs are the go-redis options Open sets where the URL does not.
type knobs struct {
	dial, read, write         *time.Duration
	maxRetries, dialerRetries *int
	contextTimeoutEnabled     *bool
}

// tune applies the timeout where the URL set none, retries once (an
// unreachable server answers within the timeout, not several), and lets
// bounded calls run on the caller's goroutine (see redisstore's Contexts).
func (c common) tune(q url.Values, k knobs) {
	for name, d := range map[string]*time.Duration{"dial_timeout": k.dial, "read_timeout": k.read, "write_timeout": k.write} {
		if !q.Has(name) {
			*d = c.opts.timeout
		}
	}
	for name, n := range map[string]*int{"max_retries": k.maxRetries, "dialer_retries": k.dialerRetries} {
		if !q.Has(name) {
			*n = 1
		}
	}
	if !q.Has("context_timeout_enabled") {
		*k.contextTimeoutEnabled = true
	}
}

// withTLS is the URL's TLS configuration (ca, cert, key) over the one
// go-redis made for a rediss scheme (keeping its server name).
func (c common) withTLS(parsed *tls.Config) *tls.Config {
	if c.tls == nil {
		return parsed
	}
	t := c.tls.Clone()
	if parsed != nil {
		t.ServerName = parsed.ServerName
	}
	return t
}

// goRedisForm turns "scheme://user@h1,h2,h3/db?q" into go-redis' form of
// several hosts, "redis://user@h1/db?q&addr=h2&addr=h3".
func goRedisForm(u *url.URL, scheme string) (string, error) {
	hosts, err := hostsOf(u)
	if err != nil {
		return "", err
	}
	g := *u
	g.Scheme, g.Host = scheme, hosts[0]
	q := g.Query()
	for _, h := range hosts[1:] {
		q.Add("addr", h)
	}
	g.RawQuery = q.Encode()
	return g.String(), nil
}

func hostsOf(u *url.URL) ([]string, error) {
	if u.Host == "" {
		return nil, fmt.Errorf("storage: store URL %q names no host", u.Redacted())
	}
	hosts := strings.Split(u.Host, ",")
	for _, h := range hosts {
		if h == "" {
			return nil, fmt.Errorf("storage: store URL %q has an empty host", u.Redacted())
		}
	}
	return hosts, nil
}

// redisStore is a redisstore.Store that closes its client with it.
type redisStore struct {
	*redisstore.Store
	client redis.UniversalClient
	scheme string
}

func (s *redisStore) Close() error { return errors.Join(s.Store.Close(), s.client.Close()) }

func (c common) redis(scheme string, client redis.UniversalClient) (Store, error) {
	opts := []redisstore.Option{redisstore.WithObserver(c.opts.observer)}
	if c.prefix != "" {
		opts = append(opts, redisstore.WithPrefix(c.prefix))
	}
	if c.recordPrefix != "" {
		opts = append(opts, redisstore.WithRecordPrefix(c.recordPrefix))
	}
	if c.replicas > 0 {
		opts = append(opts, redisstore.WithReplicas(c.replicas, c.replicaTimeout))
	}
	s, err := redisstore.New(client, opts...)
	if err != nil {
		_ = client.Close()
		return nil, fmt.Errorf("storage: %w", err)
	}
	return &redisStore{Store: s, client: client, scheme: scheme}, nil
}

// redlockStore is a redlockstore.Store that closes its clients with it.
type redlockStore struct {
	*redlockstore.Store
	clients []*redis.Client
}

func (s *redlockStore) Close() error {
	errs := []error{s.Store.Close()}
	for _, c := range s.clients {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}

func (c common) redlock(u *url.URL, q url.Values) (Store, error) {
	hosts, err := hostsOf(u)
	if err != nil {
		return nil, err
	}
	clients := make([]*redis.Client, 0, len(hosts))
	nodes := make([]redlockstore.Client, 0, len(hosts))
	closeAll := func() {
		for _, cl := range clients {
			_ = cl.Close()
		}
	}
	for _, h := range hosts {
		node := *u
		node.Scheme, node.Host = "redis", h
		opt, err := redis.ParseURL(node.String())
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("storage: store URL: %w", err)
		}
		c.tune(q, knobs{&opt.DialTimeout, &opt.ReadTimeout, &opt.WriteTimeout, &opt.MaxRetries, &opt.DialerRetries, &opt.ContextTimeoutEnabled})
		opt.TLSConfig = c.withTLS(nil)
		cl := redis.NewClient(opt)
		clients, nodes = append(clients, cl), append(nodes, cl)
	}
	opts := []redlockstore.Option{redlockstore.WithObserver(c.opts.observer)}
	if c.prefix != "" {
		opts = append(opts, redlockstore.WithPrefix(c.prefix))
	}
	if c.recordPrefix != "" {
		opts = append(opts, redlockstore.WithRecordPrefix(c.recordPrefix))
	}
	s, err := redlockstore.New(nodes, opts...)
	if err != nil {
		closeAll()
		return nil, fmt.Errorf("storage: %w", err)
	}
	return &redlockStore{Store: s, clients: clients}, nil
}

// etcdStore is an etcdstore.Store that closes its client with it.
// sql opens a SQL store and, unless migrate=false, creates its tables.
func (c common) sql(ctx context.Context, u *url.URL, q url.Values) (Store, error) {
	if c.tls != nil || c.recordPrefix != "" {
		return nil, fmt.Errorf("storage: store URL %q: %s:// takes TLS settings in the driver's own parameters and one table prefix (prefix=P)", u.Redacted(), u.Scheme)
	}
	migrate := true
	if v := q.Get("migrate"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return nil, fmt.Errorf("storage: store URL %q: migrate=%q is not a boolean", u.Redacted(), v)
		}
		migrate = b
		q.Del("migrate")
		u.RawQuery = q.Encode()
	}
	opts := []sqlstore.Option{sqlstore.WithObserver(c.opts.observer)}
	if c.prefix != "" {
		opts = append(opts, sqlstore.WithTablePrefix(c.prefix))
	}
	ctx, cancel := context.WithTimeout(ctx, c.opts.timeout)
	defer cancel()
	s, err := sqlstore.Open(ctx, u.String(), opts...)
	if err != nil {
		return nil, fmt.Errorf("storage: %w", err)
	}
	if migrate {
		if err := s.Migrate(ctx); err != nil {
			s.Close()
			return nil, fmt.Errorf("storage: %w", err)
		}
	}
	return s, nil
}

// SQLDB returns the database Open made for a postgres or mysql URL (the
// one a sqlstore.Effect's transaction runs on), or nil for another store.
func SQLDB(s Store) *sql.DB {
	if q, ok := s.(*sqlstore.Store); ok {
		return q.DB()
	}
	return nil
}

type etcdStore struct {
	*etcdstore.Store
	client *clientv3.Client
}

func (s *etcdStore) Close() error { return errors.Join(s.Store.Close(), s.client.Close()) }

func (c common) etcd(u *url.URL) (Store, error) {
	hosts, err := hostsOf(u)
	if err != nil {
		return nil, err
	}
	if u.RawQuery != "" || (u.Path != "" && u.Path != "/") {
		return nil, fmt.Errorf("storage: store URL %q: etcd:// takes no path and no parameter but prefix, record_prefix, ca, cert and key", u.Redacted())
	}
	password, _ := u.User.Password()
	client, err := clientv3.New(clientv3.Config{Endpoints: hosts, DialTimeout: c.opts.timeout, Logger: zap.NewNop(),
		Username: u.User.Username(), Password: password, TLS: c.tls})
	if err != nil {
		return nil, fmt.Errorf("storage: etcd: %w", err)
	}
	opts := []etcdstore.Option{etcdstore.WithObserver(c.opts.observer)}
	if c.prefix != "" {
		opts = append(opts, etcdstore.WithPrefix(c.prefix))
	}
	if c.recordPrefix != "" {
		opts = append(opts, etcdstore.WithRecordPrefix(c.recordPrefix))
	}
	s, err := etcdstore.New(client, opts...)
	if err != nil {
		_ = client.Close()
		return nil, fmt.Errorf("storage: %w", err)
	}
	return &etcdStore{Store: s, client: client}, nil
}

func (c common) zk(ctx context.Context, u *url.URL) (Store, error) {
	hosts, err := hostsOf(u)
	if err != nil {
		return nil, err
	}
	q := u.Query()
	session := 10 * time.Second
	if v := q.Get("session_timeout"); v != "" {
		if session, err = time.ParseDuration(v); err != nil {
			return nil, fmt.Errorf("storage: store URL %q: session_timeout: %w", u.Redacted(), err)
		}
	}
	q.Del("session_timeout")
	if len(q) > 0 || c.prefix != "" || c.recordPrefix != "" || c.tls != nil || u.User != nil {
		return nil, fmt.Errorf("storage: store URL %q: zk:// takes the root as its path and no parameter but session_timeout", u.Redacted())
	}
	opts := []zkstore.Option{zkstore.WithSessionTimeout(session), zkstore.WithObserver(c.opts.observer)}
	if root := strings.TrimSuffix(u.Path, "/"); root != "" {
		opts = append(opts, zkstore.WithRoot(root))
	}
	ctx, cancel := context.WithTimeout(ctx, c.opts.timeout)
	defer cancel()
	s, err := zkstore.Connect(ctx, hosts, opts...)
	if err != nil {
		return nil, fmt.Errorf("storage: %w", err)
	}
	return s, nil
}

// ZooKeeperConn returns the connection of a zk URL's store, or nil for
// another store.
func ZooKeeperConn(s Store) *zk.Conn {
	if z, ok := s.(*zkstore.Store); ok {
		return z.Conn()
	}
	return nil
}

// RedisClient returns the client Open made for a redis, rediss,
// redis-cluster or redis-sentinel URL, or nil for another store.
func RedisClient(s Store) redis.UniversalClient {
	if r, ok := s.(*redisStore); ok {
		return r.client
	}
	return nil
}

// RedlockClients returns the clients, one per node, Open made for a
// redlock URL, or nil for another store.
func RedlockClients(s Store) []*redis.Client {
	if r, ok := s.(*redlockStore); ok {
		return r.clients
	}
	return nil
}

// EtcdClient returns the client Open made for an etcd URL, or nil for
// another store.
func EtcdClient(s Store) *clientv3.Client {
	if e, ok := s.(*etcdStore); ok {
		return e.client
	}
	return nil
}

// Scheme returns the kind of store s is: "memory", "redis" (also for
// rediss), "redis-cluster", "redis-sentinel", "redlock", "etcd",
// "postgres", "mysql" or "zk".
func Scheme(s Store) string {
	switch s := s.(type) {
	case *memstore.Store:
		return "memory"
	case *redisStore:
		return strings.Replace(s.scheme, "rediss", "redis", 1)
	case *redlockStore:
		return "redlock"
	case *etcdStore:
		return "etcd"
	case *sqlstore.Store:
		return string(s.Dialect())
	case *zkstore.Store:
		return "zk"
	}
	return ""
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
