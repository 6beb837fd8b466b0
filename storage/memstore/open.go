package memstore

import (
	"context"
	"fmt"

	"github.com/oncekit/oncekit/storage/driver"
)

// Importing the package registers the memory:// and mem:// schemes with
// storage.Open (package storage imports it: the in-process store is
// always there).
func init() {
	driver.Register(driver.Info{Package: "memstore", Schemes: []string{"memory", "mem"}, Open: openURL,
		Usage: "  memory://                                      the in-process driver (one process only)"})
}

func openURL(_ context.Context, u *driver.URL) (driver.Store, error) {
	if u.Host != "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Prefix != "" || u.RecordPrefix != "" || u.TLS != nil {
		return nil, fmt.Errorf("store URL %q: memory:// takes no host, path or parameter", u.Redacted())
	}
	return New(WithObserver(u.Observer)), nil
}

var _ driver.Store = (*Store)(nil)
