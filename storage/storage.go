package storage

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/oncekit/oncekit/core/observe"
	"github.com/oncekit/oncekit/storage/driver"
	_ "github.com/oncekit/oncekit/storage/memstore" // memory://, always registered
)

// Help lists the URL forms of the registered drivers (every one, with
// storage/all imported), for a command's usage text.
func Help() string {
	var b strings.Builder
	b.WriteString("Store URLs:\n")
	for _, d := range driver.Drivers() {
		b.WriteString(d.Usage)
		b.WriteString("\n")
	}
	b.WriteString(commonHelp)
	return b.String()
}

// commonHelp is what every form takes.
const commonHelp = `Credentials: user:password@ before the hosts (a Redis ACL user or requirepass, an etcd user).
Unless its notes above say otherwise, a form takes:
  prefix=P          the lock key prefix
  record_prefix=P   the idempotency record prefix
  ca=FILE           PEM certificates to trust; turns TLS on
  cert=FILE key=FILE  a client certificate for TLS`

// Store is what every driver is (the driver.Store contract): a
// lock.Locker and an idemdriver.Store with their inspectors and lister, a health
// check and an observer hook, closed with Close.
type Store = driver.Store

// Warmer is a Store that opens its connections ahead of traffic: the SQL,
// Redis and Redlock drivers, whose pools otherwise open a connection when
// a request first needs it (on PostgreSQL, a server process each, and a
// preparation of each statement). A service calls Warm once, before it
// reports ready, so that the first burst of requests after a quiet start
// — a flash sale's first second — does not pay for them on its critical
// path. n is how many connections (per server); n ≤ 0 lets the driver
// choose (its pool's size). etcd and ZooKeeper keep one connection, open
// after Open, and memory none: they are not Warmers.
type Warmer interface {
	Warm(ctx context.Context, n int) error
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
// forms) with the driver registered for its scheme: import the driver's
// package (or storage/all for every driver) to register it. It makes no
// request the driver does not need: an unreachable server shows on first
// use. ctx bounds the opening itself. The Store returned is the driver's
// own (*redisstore.Store for redis://, …), and its Close also closes the
// clients Open made.
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
		return nil, errors.New("storage: no store URL\n" + Help())
	}
	if !strings.Contains(rawURL, "://") {
		return nil, fmt.Errorf("storage: store URL %q has no scheme\n%s", rawURL, Help())
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("storage: store URL: %w", err)
	}
	if u.Scheme == "" {
		return nil, fmt.Errorf("storage: store URL %q has no scheme\n%s", rawURL, Help())
	}
	open, ok := driver.Lookup(u.Scheme)
	if !ok {
		return nil, fmt.Errorf("storage: store URL scheme %q is not supported by the drivers this program imports "+
			"(registered: %s; import the driver's package, github.com/oncekit/oncekit/storage/<name>store, or storage/all for every one)\n%s",
			u.Scheme, strings.Join(driver.Schemes(), ", "), Help())
	}
	q := u.Query()
	du := &driver.URL{URL: u, Prefix: q.Get("prefix"), RecordPrefix: q.Get("record_prefix"), Timeout: o.timeout, Observer: o.observer}
	if du.TLS, err = tlsConfig(q.Get("ca"), q.Get("cert"), q.Get("key")); err != nil {
		return nil, fmt.Errorf("storage: store URL: %w", err)
	}
	for _, p := range []string{"prefix", "record_prefix", "ca", "cert", "key"} {
		q.Del(p)
	}
	// Encode writes a space as '+', which pgx reads as a '+' (a
	// PostgreSQL options=-c%20name%3Dvalue would reach the server as
	// "-c+name=value"); %20 means a space to every driver's parser.
	u.RawQuery = strings.ReplaceAll(q.Encode(), "+", "%20")
	du.Query = q
	st, err := open(ctx, du)
	if err != nil {
		return nil, fmt.Errorf("storage: %w", err)
	}
	return st, nil
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
