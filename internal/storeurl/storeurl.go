package storeurl

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

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
)

// Help describes the URL forms, for a command's usage text.
const Help = `Store URLs:
  memory://                                  the in-process driver (one process only)
  redis://[user:password@]host:port[/db]     one Redis server (rediss:// for TLS)
  redis-cluster://host:port,host:port,...    a Redis Cluster
  redlock://host:port,host:port,host:port    Redlock over N independent Redis servers
  etcd://host:port,host:port,...             an etcd cluster
Credentials: user:password@ before the hosts (a Redis ACL user or requirepass, an etcd user).
Query parameters, for stores configured with other than the defaults:
  prefix=P          the lock key prefix (WithPrefix)
  record_prefix=P   the idempotency record prefix (WithRecordPrefix)
  ca=FILE           PEM certificates to trust; turns TLS on (rediss:// is TLS already)
  cert=FILE key=FILE  a client certificate for TLS`

// Store is what every driver is.
type Store interface {
	lock.Locker
	idem.Store
	lock.Inspector
	idem.Inspector
}

// Opened is a driver and the clients it was opened with, for an
// application that keeps its own data beside the driver's (the inventory
// example's stock).
type Opened struct {
	Store  Store
	Scheme string // memory, redis, redis-cluster, redlock or etcd

	Redis   redis.UniversalClient // redis, rediss, redis-cluster
	Redlock []*redis.Client       // redlock: one client per node
	Etcd    *clientv3.Client      // etcd

	close func()
}

// Close closes the driver and its clients.
func (o *Opened) Close() {
	if o.close != nil {
		o.close()
	}
}

// Options tune how a URL is opened.
type Options struct {
	// Timeout bounds dialing and each request (default 3 s).
	Timeout time.Duration
	// Observer is the driver's observer (WithObserver), or nil.
	Observer observe.Observer
}

// Open connects to the store raw names. It makes no request: an
// unreachable server shows on first use.
func Open(raw string, o Options) (*Opened, error) {
	if o.Timeout <= 0 {
		o.Timeout = 3 * time.Second
	}
	if raw == "" {
		return nil, errors.New("no store URL")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("store URL: %w", err)
	}
	q := u.Query()
	prefix, recordPrefix := q.Get("prefix"), q.Get("record_prefix")
	tlsConf, err := tlsConfig(q.Get("ca"), q.Get("cert"), q.Get("key"))
	if err != nil {
		return nil, fmt.Errorf("store URL: %w", err)
	}
	for _, p := range []string{"prefix", "record_prefix", "ca", "cert", "key"} {
		q.Del(p)
	}
	u.RawQuery = q.Encode()
	hosts := func() ([]string, error) {
		if u.Host == "" {
			return nil, fmt.Errorf("store URL %q names no host", raw)
		}
		return strings.Split(u.Host, ","), nil
	}
	t := o.Timeout
	switch u.Scheme {
	case "memory", "mem":
		if u.Host != "" || (u.Path != "" && u.Path != "/") {
			return nil, fmt.Errorf("store URL %q: memory:// takes no host or path", raw)
		}
		s := memstore.New(memstore.WithObserver(o.Observer))
		return &Opened{Store: s, Scheme: "memory"}, nil
	case "redis", "rediss":
		opt, err := redis.ParseURL(u.String())
		if err != nil {
			return nil, fmt.Errorf("store URL: %w", err)
		}
		opt.DialTimeout, opt.ReadTimeout, opt.WriteTimeout = t, t, t
		opt.MaxRetries, opt.DialerRetries = 1, 1
		opt.ContextTimeoutEnabled = true // see rediskit.Run: bounded calls run on the caller's goroutine
		if tlsConf != nil {
			if opt.TLSConfig != nil {
				tlsConf.ServerName = opt.TLSConfig.ServerName
			}
			opt.TLSConfig = tlsConf
		}
		return openRedis(u.Scheme, redis.NewClient(opt), prefix, recordPrefix, o.Observer)
	case "redis-cluster":
		addrs, err := hosts()
		if err != nil {
			return nil, err
		}
		return openRedis(u.Scheme, redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, Username: u.User.Username(),
			Password: password(u), DialTimeout: t, ReadTimeout: t, WriteTimeout: t, TLSConfig: tlsConf,
			MaxRetries: 1, DialerRetries: 1, ContextTimeoutEnabled: true}), prefix, recordPrefix, o.Observer)
	case "redlock":
		return openRedlock(u, prefix, recordPrefix, tlsConf, o)
	case "etcd":
		addrs, err := hosts()
		if err != nil {
			return nil, err
		}
		c, err := clientv3.New(clientv3.Config{Endpoints: addrs, DialTimeout: t, Logger: zap.NewNop(),
			Username: u.User.Username(), Password: password(u), TLS: tlsConf})
		if err != nil {
			return nil, fmt.Errorf("etcd: %w", err)
		}
		opts := []etcdstore.Option{etcdstore.WithObserver(o.Observer)}
		if prefix != "" {
			opts = append(opts, etcdstore.WithPrefix(prefix))
		}
		if recordPrefix != "" {
			opts = append(opts, etcdstore.WithRecordPrefix(recordPrefix))
		}
		s, err := etcdstore.New(c, opts...)
		if err != nil {
			_ = c.Close()
			return nil, err
		}
		return &Opened{Store: s, Scheme: "etcd", Etcd: c, close: func() { _ = s.Close(); _ = c.Close() }}, nil
	case "":
		return nil, fmt.Errorf("store URL %q has no scheme\n%s", raw, Help)
	}
	return nil, fmt.Errorf("store URL scheme %q is not supported\n%s", u.Scheme, Help)
}

func openRedlock(u *url.URL, prefix, recordPrefix string, tlsConf *tls.Config, o Options) (*Opened, error) {
	if u.Host == "" {
		return nil, fmt.Errorf("store URL %q names no host", u.String())
	}
	addrs := strings.Split(u.Host, ",")
	t := o.Timeout
	clients := make([]*redis.Client, len(addrs))
	nodes := make([]redlockstore.Client, len(addrs))
	closeAll := func() {
		for _, c := range clients {
			_ = c.Close()
		}
	}
	for i, a := range addrs {
		clients[i] = redis.NewClient(&redis.Options{Addr: a, Username: u.User.Username(), Password: password(u),
			DialTimeout: t, ReadTimeout: t, WriteTimeout: t, MaxRetries: 1, DialerRetries: 1, TLSConfig: tlsConf,
			ContextTimeoutEnabled: true})
		nodes[i] = clients[i]
	}
	opts := []redlockstore.Option{redlockstore.WithObserver(o.Observer)}
	if prefix != "" {
		opts = append(opts, redlockstore.WithPrefix(prefix))
	}
	if recordPrefix != "" {
		opts = append(opts, redlockstore.WithRecordPrefix(recordPrefix))
	}
	s, err := redlockstore.New(nodes, opts...)
	if err != nil {
		closeAll()
		return nil, err
	}
	return &Opened{Store: s, Scheme: "redlock", Redlock: clients, close: func() { _ = s.Close(); closeAll() }}, nil
}

// openRedis opens a redisstore over c, which it closes with the store.
func openRedis(scheme string, c redis.UniversalClient, prefix, recordPrefix string, obs observe.Observer) (*Opened, error) {
	opts := []redisstore.Option{redisstore.WithObserver(obs)}
	if prefix != "" {
		opts = append(opts, redisstore.WithPrefix(prefix))
	}
	if recordPrefix != "" {
		opts = append(opts, redisstore.WithRecordPrefix(recordPrefix))
	}
	s, err := redisstore.New(c, opts...)
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	return &Opened{Store: s, Scheme: scheme, Redis: c, close: func() { _ = s.Close(); _ = c.Close() }}, nil
}

func password(u *url.URL) string {
	p, _ := u.User.Password()
	return p
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
