package etcdstore

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/oncekit/oncekit/storage/driver"
)

// Importing the package registers the etcd:// scheme with storage.Open.
func init() {
	driver.Register(driver.Info{Package: "etcdstore", Schemes: []string{"etcd"}, Open: openURL,
		Usage: "  etcd://host:port,host:port,...                 an etcd cluster"})
}

// openURL opens a Store over a client of u's endpoints, which the Store's
// Close closes.
func openURL(_ context.Context, u *driver.URL) (driver.Store, error) {
	hosts, err := u.Hosts()
	if err != nil {
		return nil, err
	}
	if u.RawQuery != "" || (u.Path != "" && u.Path != "/") {
		return nil, fmt.Errorf("store URL %q: etcd:// takes no path and no parameter but prefix, record_prefix, ca, cert and key", u.Redacted())
	}
	password, _ := u.User.Password()
	client, err := clientv3.New(clientv3.Config{Endpoints: hosts, DialTimeout: u.Timeout, Logger: zap.NewNop(),
		Username: u.User.Username(), Password: password, TLS: u.TLS})
	if err != nil {
		return nil, fmt.Errorf("etcd: %w", err)
	}
	opts := []Option{WithObserver(u.Observer)}
	if u.Prefix != "" {
		opts = append(opts, WithPrefix(u.Prefix))
	}
	if u.RecordPrefix != "" {
		opts = append(opts, WithRecordPrefix(u.RecordPrefix))
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
