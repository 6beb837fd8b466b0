package main

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/storage/etcdstore"
	"github.com/oncekit/oncekit/storage/redisstore"
	"github.com/oncekit/oncekit/storage/redlockstore"
)

// store is what oncectl needs of a driver.
type store interface {
	lock.Inspector
	idem.Inspector
}

// opened is a store and what closes it and its clients.
type opened struct {
	store
	close func()
}

const storeHelp = `Store URLs:
  redis://[user:password@]host:port[/db]     one Redis server (rediss:// for TLS)
  redis-cluster://host:port,host:port,...    a Redis Cluster
  redlock://host:port,host:port,host:port    Redlock over N independent Redis servers
  etcd://host:port,host:port,...             an etcd cluster
Query parameters, for stores configured with other than the defaults:
  prefix=P          the lock key prefix (WithPrefix)
  record_prefix=P   the idempotency record prefix (WithRecordPrefix)
memory:// stores live inside one process; oncectl cannot reach them.`

// openStore connects to the store named by raw (see storeHelp).
func openStore(raw string, timeout time.Duration) (*opened, error) {
	if raw == "" {
		return nil, errors.New("no store: pass --store URL or set ONCEKIT_STORE")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("store URL: %w", err)
	}
	q := u.Query()
	prefix, recordPrefix := q.Get("prefix"), q.Get("record_prefix")
	q.Del("prefix")
	q.Del("record_prefix")
	u.RawQuery = q.Encode()
	hosts := func() ([]string, error) {
		if u.Host == "" {
			return nil, fmt.Errorf("store URL %q names no host", raw)
		}
		return strings.Split(u.Host, ","), nil
	}
	switch u.Scheme {
	case "redis", "rediss":
		opt, err := redis.ParseURL(u.String())
		if err != nil {
			return nil, fmt.Errorf("store URL: %w", err)
		}
		opt.DialTimeout, opt.ReadTimeout, opt.WriteTimeout = timeout, timeout, timeout
		opt.MaxRetries, opt.DialerRetries = 1, 1
		return openRedis(redis.NewClient(opt), prefix, recordPrefix)
	case "redis-cluster":
		addrs, err := hosts()
		if err != nil {
			return nil, err
		}
		return openRedis(redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, Username: u.User.Username(),
			Password: password(u), DialTimeout: timeout, ReadTimeout: timeout, WriteTimeout: timeout,
			MaxRetries: 1, DialerRetries: 1}), prefix, recordPrefix)
	case "redlock":
		addrs, err := hosts()
		if err != nil {
			return nil, err
		}
		clients := make([]redlockstore.Client, len(addrs))
		closeAll := func() {
			for _, c := range clients {
				_ = c.(*redis.Client).Close()
			}
		}
		for i, a := range addrs {
			clients[i] = redis.NewClient(&redis.Options{Addr: a, Username: u.User.Username(), Password: password(u),
				DialTimeout: timeout, ReadTimeout: timeout, WriteTimeout: timeout, MaxRetries: 1, DialerRetries: 1})
		}
		var opts []redlockstore.Option
		if prefix != "" {
			opts = append(opts, redlockstore.WithPrefix(prefix))
		}
		if recordPrefix != "" {
			opts = append(opts, redlockstore.WithRecordPrefix(recordPrefix))
		}
		s, err := redlockstore.New(clients, opts...)
		if err != nil {
			closeAll()
			return nil, err
		}
		return &opened{s, func() { _ = s.Close(); closeAll() }}, nil
	case "etcd":
		addrs, err := hosts()
		if err != nil {
			return nil, err
		}
		c, err := clientv3.New(clientv3.Config{Endpoints: addrs, DialTimeout: timeout, Logger: zap.NewNop(),
			Username: u.User.Username(), Password: password(u)})
		if err != nil {
			return nil, fmt.Errorf("etcd: %w", err)
		}
		var opts []etcdstore.Option
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
		return &opened{s, func() { _ = s.Close(); _ = c.Close() }}, nil
	case "memory", "mem":
		return nil, errors.New("memory:// stores live inside one process; oncectl cannot reach them " +
			"(use lock.Inspector and idem.Inspector in that process)")
	case "":
		return nil, fmt.Errorf("store URL %q has no scheme\n%s", raw, storeHelp)
	}
	return nil, fmt.Errorf("store URL scheme %q is not supported\n%s", u.Scheme, storeHelp)
}

// openRedis opens a redisstore over c, which it closes with the store.
func openRedis(c redis.UniversalClient, prefix, recordPrefix string) (*opened, error) {
	var opts []redisstore.Option
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
	return &opened{s, func() { _ = s.Close(); _ = c.Close() }}, nil
}

func password(u *url.URL) string {
	p, _ := u.User.Password()
	return p
}
