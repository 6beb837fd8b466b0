package etcdstore

import (
	"errors"

	"github.com/oncekit/oncekit/core/observe"
)

// Option configures a Store.
type Option func(*options)

type options struct {
	prefix       string
	recordPrefix string
	observer     observe.Observer
}

func defaultOptions() options {
	return options{prefix: "oncekit/lock/", recordPrefix: "oncekit/idem/"}
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

func (o *options) validate() error {
	var errs []error
	if o.prefix == "" || o.recordPrefix == "" {
		errs = append(errs, errors.New("empty prefix"))
	}
	if o.prefix == o.recordPrefix {
		errs = append(errs, errors.New("the lock and record prefixes are the same"))
	}
	return errors.Join(errs...)
}
