package redlockstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/storage/driver"
	"github.com/oncekit/oncekit/storage/internal/rediskit"
)

// Importing the package registers the redlock:// scheme with storage.Open.
func init() {
	driver.Register(driver.Info{Package: "redlockstore", Schemes: []string{"redlock"}, Open: openURL,
		Usage: "  redlock://host:port,host:port,host:port        Redlock over N independent Redis servers"})
}

// openURL opens a Store over one client per host of u (each host a node,
// with go-redis' parameters of redis://), which the Store's Close closes.
func openURL(_ context.Context, u *driver.URL) (driver.Store, error) {
	hosts, err := u.Hosts()
	if err != nil {
		return nil, err
	}
	clients := make([]Client, 0, len(hosts))
	var closers []func() error
	closeAll := func() error {
		var errs []error
		for _, c := range closers {
			errs = append(errs, c())
		}
		return errors.Join(errs...)
	}
	for _, h := range hosts {
		node := *u.URL
		node.Scheme, node.Host = "redis", h
		opt, err := redis.ParseURL(node.String())
		if err != nil {
			_ = closeAll()
			return nil, fmt.Errorf("store URL: %w", err)
		}
		rediskit.Tune(u.Query, u.Timeout, rediskit.Knobs{Dial: &opt.DialTimeout, Read: &opt.ReadTimeout, Write: &opt.WriteTimeout,
			MaxRetries: &opt.MaxRetries, DialerRetries: &opt.DialerRetries, ContextTimeoutEnabled: &opt.ContextTimeoutEnabled})
		opt.TLSConfig = rediskit.WithTLS(u.TLS, nil)
		c := redis.NewClient(opt)
		clients, closers = append(clients, c), append(closers, c.Close)
	}
	opts := []Option{WithObserver(u.Observer)}
	if u.Prefix != "" {
		opts = append(opts, WithPrefix(u.Prefix))
	}
	if u.RecordPrefix != "" {
		opts = append(opts, WithRecordPrefix(u.RecordPrefix))
	}
	s, err := New(clients, opts...)
	if err != nil {
		_ = closeAll()
		return nil, err
	}
	s.owned = closeAll
	return s, nil
}

var _ driver.Store = (*Store)(nil)
