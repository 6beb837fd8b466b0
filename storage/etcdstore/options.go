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
	sessionTTL   time.Duration
	observer     observe.Observer
}

func defaultOptions() options {
	return options{prefix: "oncekit/lock/", recordPrefix: "oncekit/idem/", sessionTTL: 10 * time.Second}
}

// WithRecordPrefix sets the etcd key prefix of the idempotency records
// (idem.Store). It must differ from the lock prefix. Default "oncekit/idem/".
func WithRecordPrefix(p string) Option { return func(o *options) { o.recordPrefix = p } }

// WithObserver sets where the Store reports hand-offs, and where the
// lock.Mutex and idem.Guard built on it report their operations (see
// package observe). Default: none.
func WithObserver(obs observe.Observer) Option { return func(o *options) { o.observer = obs } }

// WithPrefix sets the etcd key prefix under which every lock lives.
// Default "oncekit/lock/".
func WithPrefix(p string) Option { return func(o *options) { o.prefix = p } }

// WithSessionTTL sets the TTL of the Store's session lease, rounded up to
// whole seconds. It bounds how long the locks of a process that died (or
// lost the servers) outlive it; the Store keeps the session alive while it
// runs. etcd raises very short TTLs to its own minimum (about 1.5 s with
// default settings). Default 10 s.
func WithSessionTTL(d time.Duration) Option { return func(o *options) { o.sessionTTL = d } }

func (o *options) validate() error {
	var errs []error
	if o.prefix == "" || o.recordPrefix == "" {
		errs = append(errs, errors.New("empty prefix"))
	}
	if o.prefix == o.recordPrefix {
		errs = append(errs, errors.New("the lock and record prefixes are the same"))
	}
	if o.sessionTTL < time.Second {
		errs = append(errs, fmt.Errorf("session TTL %s is under 1s", o.sessionTTL))
	}
	return errors.Join(errs...)
}
