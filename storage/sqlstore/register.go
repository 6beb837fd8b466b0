package sqlstore

import (
	"context"
	"fmt"
	"strconv"

	"github.com/oncekit/oncekit/storage/driver"
)

// Importing the package registers the postgres://, postgresql:// and
// mysql:// schemes with storage.Open.
func init() { driver.Register(openURL, "postgres", "postgresql", "mysql") }

// openURL opens a Store that owns its database (Open) and, unless
// migrate=false, creates its tables and adds missing columns before it
// returns, and builds missing indexes in the background (Migrate).
func openURL(ctx context.Context, u *driver.URL) (driver.Store, error) {
	if u.TLS != nil || u.RecordPrefix != "" {
		return nil, fmt.Errorf("store URL %q: %s:// takes TLS settings in the driver's own parameters and one table prefix (prefix=P)", u.Redacted(), u.Scheme)
	}
	migrate := true
	if v := u.Query.Get("migrate"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return nil, fmt.Errorf("store URL %q: migrate=%q is not a boolean", u.Redacted(), v)
		}
		migrate = b
		u.Query.Del("migrate")
		u.RawQuery = u.Query.Encode()
	}
	opts := []Option{WithObserver(u.Observer)}
	if u.Prefix != "" {
		opts = append(opts, WithTablePrefix(u.Prefix))
	}
	ctx, cancel := context.WithTimeout(ctx, u.Timeout)
	defer cancel()
	s, err := Open(ctx, u.String(), opts...)
	if err != nil {
		return nil, err
	}
	if migrate {
		// The tables and columns now; indexes (minutes on a large table,
		// built without blocking writers) in the background.
		if err := s.migrateInBackground(ctx); err != nil {
			s.Close()
			return nil, err
		}
	} else if err := s.CheckLayout(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

var _ driver.Store = (*Store)(nil)
