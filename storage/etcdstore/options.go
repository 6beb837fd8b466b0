package etcdstore

import (
	"errors"
	"fmt"
	"time"

	"github.com/oncekit/oncekit/core/observe"
)

// Option configures a Store.
type Option func(*options)

type options struct {
	prefix       string
	recordPrefix string
	stockPrefix  string
	observer     observe.Observer
	linger       time.Duration
	maxHandOffs  int
	maxHold      time.Duration
}

func defaultOptions() options {
	return options{prefix: "oncekit/lock/", recordPrefix: "oncekit/idem/", stockPrefix: "oncekit/stock/",
		linger: 100 * time.Microsecond, maxHandOffs: 16, maxHold: time.Millisecond}
}

// WithLinger sets how long a Release keeps a hot key's entry for this
// Store's next Acquire of it before deleting it. A key is hot here when
// the Store asked for it again within 10 ms of letting it go (a loop, or a
// stream of requests for one item), and no kept entry of it went unused in
// the last 100 ms (two processes taking turns); its next Acquire then
// takes the key
// with no request: the same entry, the entry's validity (at least 7/8 of
// the asked TTL left), and the next fence (fences are 128 × the entry's
// create revision, plus one per lease of the entry). Within
// WithMaxLocalHandOffs leases in a row, or as many as start within
// WithMaxLocalHold of taking the key, whichever is more, the entry is then
// deleted so that the next waiting process gets its turn.
//
// The price, for hot keys only: the key stays held for up to the linger
// after Release returns, and a process that exits in that moment without
// Close leaves it held until its session's TTL ends.
// 0 turns it off. Default 100 µs.
func WithLinger(d time.Duration) Option { return func(o *options) { o.linger = d } }

// WithMaxLocalHandOffs and WithMaxLocalHold bound how long a kept entry
// (WithLinger) serves this Store's leases: n leases in a row, or as many
// as start within d of taking the key, whichever is more, and at most 127
// per entry. n = 0 turns keeping off (fences stay 128 × the entry's
// create revision, as on every Store, so that Stores with and without it
// can share keys). Defaults 16 and 1 ms.
func WithMaxLocalHandOffs(n int) Option { return func(o *options) { o.maxHandOffs = n } }

// WithMaxLocalHold: see WithMaxLocalHandOffs.
func WithMaxLocalHold(d time.Duration) Option { return func(o *options) { o.maxHold = d } }

// WithRecordPrefix sets the etcd key prefix of the idempotency records
// (idemdriver.Store). It must differ from the lock prefix. Default "oncekit/idem/".
func WithRecordPrefix(p string) Option { return func(o *options) { o.recordPrefix = p } }

// WithObserver sets where the Store reports hand-offs, and where the
// lock.Mutex and idem.Guard built on it report their operations (see
// package observe). Default: none.
func WithObserver(obs observe.Observer) Option { return func(o *options) { o.observer = obs } }

// WithStockPrefix sets the etcd key prefix under which stock (package
// stock) lives. It must differ from the lock and record prefixes.
// Default "oncekit/stock/".
func WithStockPrefix(p string) Option { return func(o *options) { o.stockPrefix = p } }

// WithPrefix sets the etcd key prefix under which every lock lives.
// Default "oncekit/lock/".
func WithPrefix(p string) Option { return func(o *options) { o.prefix = p } }

func (o *options) validate() error {
	var errs []error
	if o.prefix == "" || o.recordPrefix == "" || o.stockPrefix == "" {
		errs = append(errs, errors.New("empty prefix"))
	}
	if o.prefix == o.recordPrefix || o.stockPrefix == o.prefix || o.stockPrefix == o.recordPrefix {
		errs = append(errs, errors.New("the lock, record and stock prefixes are not all different"))
	}
	if o.linger < 0 || o.maxHandOffs < 0 || o.maxHold < 0 {
		errs = append(errs, fmt.Errorf("negative linger %s, max local hand-offs %d or max local hold %s",
			o.linger, o.maxHandOffs, o.maxHold))
	}
	return errors.Join(errs...)
}
