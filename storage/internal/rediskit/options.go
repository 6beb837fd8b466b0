package rediskit

import (
	"fmt"
	"strings"
	"time"

	"github.com/oncekit/oncekit/core/observe"
	"github.com/oncekit/oncekit/storage/internal/redisnotify"
)

// Options are the settings both Redis drivers take; each driver documents
// its defaults on its own With functions.
type Options struct {
	Prefix       string // locks' keys and channels
	RecordPrefix string // idempotency records' keys and channels
	StockPrefix  string // stock's keys (redisstore)
	PubSub       redisnotify.Mode
	Recheck      time.Duration // longest sleep of a waiter without a release message
	MinBackoff   time.Duration // jittered backoff bounds when no message can be relied on
	MaxBackoff   time.Duration
	Observer     observe.Observer
}

// Validate reports every setting that is out of range.
func (o *Options) Validate() []error {
	var errs []error
	if strings.ContainsAny(o.Prefix, "{}") {
		errs = append(errs, fmt.Errorf("prefix %q contains '{' or '}'", o.Prefix))
	}
	if strings.ContainsAny(o.RecordPrefix, "{}") || o.RecordPrefix == o.Prefix {
		errs = append(errs, fmt.Errorf("record prefix %q contains '{' or '}' or equals the lock prefix", o.RecordPrefix))
	}
	if strings.ContainsAny(o.StockPrefix, "{}") || (o.StockPrefix != "" && (o.StockPrefix == o.Prefix || o.StockPrefix == o.RecordPrefix)) {
		errs = append(errs, fmt.Errorf("stock prefix %q contains '{' or '}' or equals another prefix", o.StockPrefix))
	}
	if !o.PubSub.Valid() {
		errs = append(errs, fmt.Errorf("unknown pub/sub mode %d", int(o.PubSub)))
	}
	if o.Recheck <= 0 {
		errs = append(errs, fmt.Errorf("recheck interval %s is not positive", o.Recheck))
	}
	if o.MinBackoff <= 0 || o.MaxBackoff < o.MinBackoff {
		errs = append(errs, fmt.Errorf("backoff bounds %s..%s are not 0 < min <= max", o.MinBackoff, o.MaxBackoff))
	}
	return errs
}
