package redlockstore

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/oncekit/oncekit/core/observe"
	"github.com/oncekit/oncekit/internal/redisnotify"
)

// PubSubMode selects how a release wakes the waiters of other clients.
type PubSubMode = redisnotify.Mode

// The pub/sub modes; see redisstore for their meaning.
const (
	PubSubAuto    = redisnotify.Auto
	PubSubSharded = redisnotify.Sharded
	PubSubClassic = redisnotify.Classic
	PubSubOff     = redisnotify.Off
)

// Option configures a Store.
type Option func(*options)

type options struct {
	prefix       string
	recordPrefix string
	nodeTimeout  time.Duration // 0: derived from the TTL
	driftFactor  float64
	driftFloor   time.Duration
	fenced       bool
	pubsub       PubSubMode
	recheck      time.Duration
	minBackoff   time.Duration
	maxBackoff   time.Duration
	observer     observe.Observer
}

func defaultOptions() options {
	return options{
		prefix:       "oncekit:redlock:",
		recordPrefix: "oncekit:redlock-idem:",
		driftFactor:  0.01,
		driftFloor:   2 * time.Millisecond,
		fenced:       true,
		pubsub:       PubSubAuto,
		recheck:      time.Second,
		minBackoff:   2 * time.Millisecond,
		maxBackoff:   100 * time.Millisecond,
	}
}

// WithPrefix sets the prefix of every Redis key and channel. It must not
// contain '{' or '}'. Default "oncekit:redlock:".
func WithPrefix(p string) Option { return func(o *options) { o.prefix = p } }

// WithObserver sets where the Store reports hand-offs, and where the
// lock.Mutex and idem.Guard built on it report their operations (see
// package observe). Default: none.
func WithObserver(obs observe.Observer) Option { return func(o *options) { o.observer = obs } }

// WithRecordPrefix sets the prefix of the idempotency records (idem.Store).
// It must not contain '{' or '}'. Default "oncekit:redlock-idem:".
func WithRecordPrefix(p string) Option { return func(o *options) { o.recordPrefix = p } }

// WithNodeTimeout sets how long one round waits for a node before counting
// it as failed. Default: a tenth of the lease's TTL, at least 50 ms and at
// most 1 s — small against the TTL, so that a slow node costs little of the
// lease's validity, and large enough for a loaded network.
func WithNodeTimeout(d time.Duration) Option { return func(o *options) { o.nodeTimeout = d } }

// WithDrift sets the clock drift allowance subtracted from every lease's
// validity: factor × TTL + floor. Default 1 % of the TTL + 2 ms.
func WithDrift(factor float64, floor time.Duration) Option {
	return func(o *options) { o.driftFactor, o.driftFloor = factor, floor }
}

// WithoutFencing skips the fence counters and the second round that makes
// fences sound. Leases then report Fence() == 0. For callers that only need
// mutual exclusion; see the package documentation. Default: fenced.
func WithoutFencing() Option { return func(o *options) { o.fenced = false } }

// WithPubSub selects the release notification mechanism. Default PubSubAuto.
func WithPubSub(m PubSubMode) Option { return func(o *options) { o.pubsub = m } }

// WithRecheckInterval bounds how long a waiter sleeps without a release
// message before trying again. Default 1 s.
func WithRecheckInterval(d time.Duration) Option { return func(o *options) { o.recheck = d } }

// WithBackoff bounds the jittered backoff after a split vote (competing
// clients each took some nodes but none a majority) or a failed round.
// Default 2 ms to 100 ms.
func WithBackoff(min, max time.Duration) Option {
	return func(o *options) { o.minBackoff, o.maxBackoff = min, max }
}

func (o *options) validate() error {
	var errs []error
	if strings.ContainsAny(o.prefix, "{}") {
		errs = append(errs, fmt.Errorf("prefix %q contains '{' or '}'", o.prefix))
	}
	if strings.ContainsAny(o.recordPrefix, "{}") || o.recordPrefix == o.prefix {
		errs = append(errs, fmt.Errorf("record prefix %q contains '{' or '}' or equals the lock prefix", o.recordPrefix))
	}
	if o.nodeTimeout < 0 {
		errs = append(errs, fmt.Errorf("node timeout %s is negative", o.nodeTimeout))
	}
	if o.driftFactor < 0 || o.driftFactor >= 0.5 || o.driftFloor < 0 {
		errs = append(errs, fmt.Errorf("drift %.3f×TTL+%s is out of range", o.driftFactor, o.driftFloor))
	}
	if !o.pubsub.Valid() {
		errs = append(errs, fmt.Errorf("unknown pub/sub mode %d", int(o.pubsub)))
	}
	if o.recheck <= 0 {
		errs = append(errs, fmt.Errorf("recheck interval %s is not positive", o.recheck))
	}
	if o.minBackoff <= 0 || o.maxBackoff < o.minBackoff {
		errs = append(errs, fmt.Errorf("backoff bounds %s..%s are not 0 < min <= max", o.minBackoff, o.maxBackoff))
	}
	return errors.Join(errs...)
}
