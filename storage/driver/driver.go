package driver

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/lock/lockdriver"
	"github.com/oncekit/oncekit/core/observe"
)

// Store is the contract every driver keeps: a lock.Locker and an
// idemdriver.Store with their inspectors and lister, a health check, an
// observer hook, closed with Close. Each driver checks it at compile time
// (var _ driver.Store = (*Store)(nil)), and the conformance suites
// (lock/locktest, idem/idemtest) check its behaviour.
type Store interface {
	lock.Locker
	idemdriver.Store
	lockdriver.Inspector
	idemdriver.Inspector
	idemdriver.Lister
	// Ping reports whether the store can serve now, for a readiness
	// probe: one request to the server (to every Redlock node, healthy
	// with a majority).
	Ping(ctx context.Context) error
	// DriverName and Observer (observe.Source): the driver's name in
	// metrics and traces, and the observer it reports to.
	observe.Source
	// Close stops the Store; after it TryAcquire, Acquire and Begin fail
	// with an error matching lock.ErrClosed, and a second Close returns
	// nil. A Store opened from a URL closes the clients it made.
	Close() error
}

// URL is a store URL as an OpenFunc receives it: the URL with oncekit's
// common parameters taken out (URL.RawQuery and Query hold the rest, for
// the driver to use or refuse), and those parameters parsed.
type URL struct {
	*url.URL
	// Query is URL.RawQuery parsed: the parameters left for the driver.
	Query url.Values
	// Prefix and RecordPrefix are prefix=P and record_prefix=P ("" when
	// absent): the lock key prefix and the idempotency record prefix.
	Prefix, RecordPrefix string
	// TLS is the configuration of ca=FILE, cert=FILE and key=FILE, nil
	// when none is set.
	TLS *tls.Config
	// Timeout bounds dialing and each request of the clients the driver
	// makes, where the URL does not set its own (storage.WithTimeout).
	Timeout time.Duration
	// Observer is storage.WithObserver's observer (nil for none).
	Observer observe.Observer
}

// Hosts are the URL's comma-separated hosts; an error when it names none
// or one is empty.
func (u *URL) Hosts() ([]string, error) {
	if u.Host == "" {
		return nil, fmt.Errorf("store URL %q names no host", u.Redacted())
	}
	hosts := strings.Split(u.Host, ",")
	if slices.Contains(hosts, "") {
		return nil, fmt.Errorf("store URL %q has an empty host", u.Redacted())
	}
	return hosts, nil
}

// OpenFunc opens the store u names. It makes no request the driver does
// not need to be usable (an unreachable server shows on first use where
// the driver allows); ctx bounds the opening itself.
type OpenFunc func(ctx context.Context, u *URL) (Store, error)

// Info is what a driver registers: everything storage.Open, its help text,
// oncectl and the documentation checks know of it comes from here.
type Info struct {
	// Package is the driver's package name ("redisstore"), under
	// github.com/oncekit/oncekit/storage/.
	Package string
	// Schemes are the URL schemes it opens ("redis", "rediss", …).
	Schemes []string
	// Usage is its lines of storage.Help: each URL form, padded to the
	// 49th column, and what it opens; then notes on its parameters.
	Usage string
	// Open opens a store from a URL of one of its schemes.
	Open OpenFunc
}

var (
	mu      sync.RWMutex
	openers = map[string]OpenFunc{}
	drivers = map[string]Info{}
)

// Register makes the driver's URL schemes open with its Open. A driver
// package calls it from an init function, so that importing the driver
// (or storage/all, which imports every driver) is what makes storage.Open
// know its schemes. It panics when Open is nil, a scheme is registered
// twice or the package has no name, as database/sql's Register does.
func Register(d Info) {
	if d.Open == nil || d.Package == "" || len(d.Schemes) == 0 {
		panic("storage/driver: Register: an Info needs a Package, Schemes and Open")
	}
	mu.Lock()
	defer mu.Unlock()
	if _, dup := drivers[d.Package]; dup {
		panic("storage/driver: Register called twice for " + d.Package)
	}
	for _, s := range d.Schemes {
		if _, dup := openers[s]; dup {
			panic("storage/driver: Register called twice for scheme " + s)
		}
		openers[s] = d.Open
	}
	d.Schemes = slices.Clone(d.Schemes)
	drivers[d.Package] = d
}

// Lookup returns the OpenFunc registered for scheme.
func Lookup(scheme string) (OpenFunc, bool) {
	mu.RLock()
	defer mu.RUnlock()
	open, ok := openers[scheme]
	return open, ok
}

// Drivers returns the registered drivers: memstore (always registered,
// the default) first, then by package name.
func Drivers() []Info {
	mu.RLock()
	defer mu.RUnlock()
	out := make([]Info, 0, len(drivers))
	for _, d := range drivers {
		out = append(out, d)
	}
	slices.SortFunc(out, func(a, b Info) int {
		switch {
		case a.Package == b.Package:
			return 0
		case a.Package == "memstore":
			return -1
		case b.Package == "memstore":
			return 1
		}
		return strings.Compare(a.Package, b.Package)
	})
	return out
}

// Schemes returns the registered schemes, sorted.
func Schemes() []string {
	mu.RLock()
	defer mu.RUnlock()
	var s []string
	for k := range openers {
		s = append(s, k)
	}
	slices.Sort(s)
	return s
}
