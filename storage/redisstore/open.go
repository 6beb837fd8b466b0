package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/storage/driver"
	"github.com/oncekit/oncekit/storage/internal/rediskit"
)

// Importing the package registers its URL schemes with storage.Open.
func init() {
	driver.Register(driver.Info{Package: "redisstore", Open: openURL,
		Schemes: []string{"redis", "rediss", "redis-cluster", "rediss-cluster", "redis-sentinel", "rediss-sentinel"},
		Usage: `  redis://[user:password@]host:port[/db]         one Redis server (rediss:// for TLS)
  redis-cluster://[user:password@]host:port,...  a Redis Cluster (rediss-cluster:// for TLS)
  redis-sentinel://host:port,...[/db]?master_name=NAME
                                                 a primary managed by Sentinel (the hosts are the sentinels)
  Redis forms take go-redis' query parameters (dial_timeout=2s, pool_size=50, ...)
  and replicas=N (replica_timeout=1s): every lease and claim waits for N
  replicas (redisstore.WithReplicas).`})
}

// openURL opens a Store over a client made from u (go-redis' own URL forms,
// several hosts comma-separated), which the Store's Close closes.
func openURL(_ context.Context, u *driver.URL) (driver.Store, error) {
	q := u.Query
	var repl rediskit.Replication
	if v := q.Get("replicas"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("store URL %q: replicas=%s is not a count of at least 1", u.Redacted(), v)
		}
		repl = rediskit.Replication{Replicas: n, Timeout: time.Second}
		if v := q.Get("replica_timeout"); v != "" {
			if repl.Timeout, err = time.ParseDuration(v); err != nil || repl.Timeout <= 0 {
				return nil, fmt.Errorf("store URL %q: replica_timeout=%s is not a positive duration", u.Redacted(), v)
			}
		}
	} else if q.Has("replica_timeout") {
		return nil, fmt.Errorf("store URL %q: replica_timeout= goes with replicas=N", u.Redacted())
	}
	q.Del("replicas")
	q.Del("replica_timeout")
	u.RawQuery = q.Encode()
	base := strings.TrimSuffix(strings.TrimSuffix(u.Scheme, "-cluster"), "-sentinel") // redis or rediss
	var client redis.UniversalClient
	switch {
	case strings.HasSuffix(u.Scheme, "-cluster"):
		hosts, err := u.Hosts()
		if err != nil {
			return nil, err
		}
		opt, err := redis.ParseClusterURL(rediskit.MultiHostForm(u.URL, base, hosts))
		if err != nil {
			return nil, fmt.Errorf("store URL: %w", err)
		}
		rediskit.Tune(q, u.Timeout, rediskit.Knobs{Dial: &opt.DialTimeout, Read: &opt.ReadTimeout, Write: &opt.WriteTimeout,
			MaxRetries: &opt.MaxRetries, DialerRetries: &opt.DialerRetries, ContextTimeoutEnabled: &opt.ContextTimeoutEnabled})
		opt.TLSConfig = rediskit.WithTLS(u.TLS, opt.TLSConfig)
		client = redis.NewClusterClient(opt)
	case strings.HasSuffix(u.Scheme, "-sentinel"):
		hosts, err := u.Hosts()
		if err != nil {
			return nil, err
		}
		opt, err := redis.ParseFailoverURL(rediskit.MultiHostForm(u.URL, base, hosts))
		if err != nil {
			return nil, fmt.Errorf("store URL: %w", err)
		}
		if opt.MasterName == "" {
			return nil, fmt.Errorf("store URL %q: %s:// needs master_name=NAME", u.Redacted(), u.Scheme)
		}
		rediskit.Tune(q, u.Timeout, rediskit.Knobs{Dial: &opt.DialTimeout, Read: &opt.ReadTimeout, Write: &opt.WriteTimeout,
			MaxRetries: &opt.MaxRetries, DialerRetries: &opt.DialerRetries, ContextTimeoutEnabled: &opt.ContextTimeoutEnabled})
		opt.TLSConfig = rediskit.WithTLS(u.TLS, opt.TLSConfig)
		client = redis.NewFailoverClient(opt)
	default:
		opt, err := redis.ParseURL(u.String())
		if err != nil {
			return nil, fmt.Errorf("store URL: %w", err)
		}
		rediskit.Tune(q, u.Timeout, rediskit.Knobs{Dial: &opt.DialTimeout, Read: &opt.ReadTimeout, Write: &opt.WriteTimeout,
			MaxRetries: &opt.MaxRetries, DialerRetries: &opt.DialerRetries, ContextTimeoutEnabled: &opt.ContextTimeoutEnabled})
		opt.TLSConfig = rediskit.WithTLS(u.TLS, opt.TLSConfig)
		client = redis.NewClient(opt)
	}
	opts := []Option{WithObserver(u.Observer)}
	if u.Prefix != "" {
		opts = append(opts, WithPrefix(u.Prefix))
	}
	if u.RecordPrefix != "" {
		opts = append(opts, WithRecordPrefix(u.RecordPrefix))
	}
	if repl.Replicas > 0 {
		opts = append(opts, WithReplicas(repl.Replicas, repl.Timeout))
	}
	s, err := New(client, opts...)
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	s.owned = client.Close
	return s, nil
}

var _ driver.Store = (*Store)(nil)
