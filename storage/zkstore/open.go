package zkstore

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/oncekit/oncekit/storage/driver"
)

// Importing the package registers the zk:// and zookeeper:// schemes with
// storage.Open.
func init() {
	driver.Register(driver.Info{Package: "zkstore", Schemes: []string{"zk", "zookeeper"}, Open: openURL,
		Usage: `  zk://host:port,host:port,...[/root][?session_timeout=10s]
                                                 a ZooKeeper ensemble (znodes under root, default /oncekit)
  zk:// waits for a session (within the timeout) and takes no other parameter.`})
}

// openURL connects a Store to u's ensemble (Connect, within u.Timeout),
// with the root as the URL's path.
func openURL(ctx context.Context, u *driver.URL) (driver.Store, error) {
	hosts, err := u.Hosts()
	if err != nil {
		return nil, err
	}
	q := u.Query
	session := 10 * time.Second
	if v := q.Get("session_timeout"); v != "" {
		if session, err = time.ParseDuration(v); err != nil {
			return nil, fmt.Errorf("store URL %q: session_timeout: %w", u.Redacted(), err)
		}
	}
	q.Del("session_timeout")
	if len(q) > 0 || u.Prefix != "" || u.RecordPrefix != "" || u.TLS != nil || u.User != nil {
		return nil, fmt.Errorf("store URL %q: zk:// takes the root as its path and no parameter but session_timeout", u.Redacted())
	}
	opts := []Option{WithSessionTimeout(session), WithObserver(u.Observer)}
	if root := strings.TrimSuffix(u.Path, "/"); root != "" {
		opts = append(opts, WithRoot(root))
	}
	ctx, cancel := context.WithTimeout(ctx, u.Timeout)
	defer cancel()
	s, err := Connect(ctx, hosts, opts...)
	if err != nil {
		return nil, err // (not a nil *Store in a non-nil interface)
	}
	return s, nil
}

var _ driver.Store = (*Store)(nil)
