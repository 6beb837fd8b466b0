package redisstore

import (
	"errors"
	"fmt"
	"time"

	"github.com/oncekit/oncekit/core/observe"
	"github.com/oncekit/oncekit/storage/internal/rediskit"
	"github.com/oncekit/oncekit/storage/internal/redisnotify"
)

// PubSubMode selects how a release wakes the waiters of other clients.
type PubSubMode int

const (
	// PubSubAuto uses sharded pub/sub (SPUBLISH/SSUBSCRIBE) on Redis 7 and
	// later, classic pub/sub before. The default.
	PubSubAuto PubSubMode = iota
	// PubSubSharded always uses SPUBLISH/SSUBSCRIBE (Redis ≥ 7).
	PubSubSharded
	// PubSubClassic always uses PUBLISH/SUBSCRIBE.
	PubSubClassic
	// PubSubOff publishes nothing; waiters wait for the holder's remaining
	// TTL or the recheck interval. For servers where pub/sub is disabled.
	PubSubOff
)

// Option configures a Store.
type Option func(*options)

type options struct {
	rediskit.Options
	maxHandOffs int
	maxHold     time.Duration
	linger      time.Duration
	unfenced    bool
	replication rediskit.Replication
}

func defaultOptions() options {
	return options{
		Options: rediskit.Options{
			Prefix:       "oncekit:lock:",
			RecordPrefix: "oncekit:idem:",
			StockPrefix:  "oncekit:stock:",
			PubSub:       redisnotify.Auto,
			Recheck:      time.Second,
			MinBackoff:   5 * time.Millisecond,
			MaxBackoff:   250 * time.Millisecond,
		},
		maxHandOffs: 16,
		maxHold:     time.Millisecond,
		linger:      100 * time.Microsecond,
	}
}

// WithoutFencing takes locks without issuing fences: leases report
// Fence() == 0, and a key nobody holds is taken with one plain SET NX
// instead of a script — the cost of redsync or redislock (a new key: 4
// server commands against 6 fenced), for callers that need only mutual
// exclusion and never hand a fence to the resource they guard (see the
// package documentation). Idempotency claims keep their fences. Default:
// fenced.
func WithoutFencing() Option { return func(o *options) { o.unfenced = true } }

// WithReplicas makes every write that grants, refreshes or completes a
// lease or a claim wait until n replicas of the primary have it (WAIT n
// timeout, in the same round trip as the write), so that a failover to
// one of them cannot lose it. A lease or claim that fewer replicas
// acknowledged in time is given back, and the call fails with an error
// matching ErrNotReplicated. Fences are written by the same scripts, so
// they are covered too. The cost is the replicas' acknowledgement on every
// such write (see BENCHMARKS.md). WAIT does not make a write durable on
// disk, and an acknowledged write can still be lost if every replica that
// has it is lost with the primary. Default: no waiting.
func WithReplicas(n int, timeout time.Duration) Option {
	return func(o *options) { o.replication = rediskit.Replication{Replicas: n, Timeout: timeout} }
}

// ErrNotReplicated reports a lease or claim that fewer replicas than
// WithReplicas asks for acknowledged in time: it was given back.
var ErrNotReplicated = rediskit.ErrNotReplicated

// WithPrefix sets the prefix of every Redis key and channel the Store
// uses. It must not contain '{' or '}', which would break the hash tag that
// keeps a lock's keys in one Redis Cluster slot. Default "oncekit:lock:".
func WithPrefix(p string) Option { return func(o *options) { o.Prefix = p } }

// WithRecordPrefix sets the prefix of the idempotency records (idemdriver.Store)
// and their channels. It must not contain '{' or '}'.
// Default "oncekit:idem:".
func WithRecordPrefix(p string) Option { return func(o *options) { o.RecordPrefix = p } }

// WithStockPrefix sets the prefix of the keys that keep stock (package
// stock). It must not contain '{' or '}'. Default "oncekit:stock:".
func WithStockPrefix(p string) Option { return func(o *options) { o.StockPrefix = p } }

// WithPubSub selects the release notification mechanism. Every Store that
// shares keys must use the same mode. Default PubSubAuto.
func WithPubSub(m PubSubMode) Option { return func(o *options) { o.PubSub = redisnotify.Mode(m) } }

// WithRecheckInterval bounds how long a waiting Acquire sleeps before it
// tries again even without a release message, in case one was lost (a
// pub/sub reconnect). Waiters normally wake on the release message or the
// holder's remaining TTL, whichever comes first. Default 1 s.
func WithRecheckInterval(d time.Duration) Option { return func(o *options) { o.Recheck = d } }

// WithBackoff sets the bounds of the jittered exponential backoff a waiter
// uses when it cannot subscribe and the holder's TTL is unknown (a key
// without expiry). Default 5 ms to 250 ms.
func WithBackoff(min, max time.Duration) Option {
	return func(o *options) { o.MinBackoff, o.MaxBackoff = min, max }
}

// WithObserver sets where the Store reports hand-offs, and where the
// lock.Mutex and idem.Guard built on it report their operations (see
// package observe). Default: none.
func WithObserver(obs observe.Observer) Option { return func(o *options) { o.Observer = obs } }

// WithMaxLocalHandOffs and WithMaxLocalHold bound how long a key is handed
// from one lease of this Store straight to the next waiter of this Store,
// or kept for the Store's own next Acquire (WithLinger), before it is let
// go so that other processes can take it: n hand-offs in a row, or as many
// as start within d after the Store took the key from Redis, whichever is
// more. A hand-off needs no round trip while the hold has more than 7/8 of
// the next lease's TTL left and reserved fences left (up to 128 per take:
// see the package doc), and one otherwise; either way the next lease gets
// a higher fence. n = 0 turns hand-offs off: every Release lets the key
// go. Fences are the same whatever n is. Defaults 16 and 1 ms.
func WithMaxLocalHandOffs(n int) Option { return func(o *options) { o.maxHandOffs = n } }

// WithMaxLocalHold: see WithMaxLocalHandOffs.
func WithMaxLocalHold(d time.Duration) Option { return func(o *options) { o.maxHold = d } }

// WithLinger sets how long a Release keeps a hot key for this Store's next
// Acquire of it before letting it go in Redis. A key is hot here when the
// Store asked for it again within 10 ms of letting it go (a loop, or a
// stream of requests for one item), and no kept hold of it went unused in
// the last 100 ms (two processes taking turns). Its next Acquire then
// takes the key with no round trip (a new lease with a higher fence,
// within WithMaxLocalHandOffs and WithMaxLocalHold), which is what lets a
// process that takes one key over and over go at memory speed while other
// processes still get their turn.
//
// The price, for hot keys only: the key stays held for up to the linger
// after Release returns, so another process's TryAcquire may find it busy,
// and a process that exits in that moment without Close leaves it held
// until its TTL ends. Close lets kept keys go. 0 turns it
// off. Default 100 µs.
func WithLinger(d time.Duration) Option { return func(o *options) { o.linger = d } }

func (o *options) validate() error {
	errs := o.Options.Validate()
	if o.maxHandOffs < 0 {
		errs = append(errs, fmt.Errorf("max local hand-offs %d is negative", o.maxHandOffs))
	}
	if o.maxHold < 0 {
		errs = append(errs, fmt.Errorf("max local hold %v is negative", o.maxHold))
	}
	if o.linger < 0 {
		errs = append(errs, fmt.Errorf("linger %v is negative", o.linger))
	}
	if r := o.replication; r.Replicas < 0 || (r.Replicas > 0 && r.Timeout <= 0) {
		errs = append(errs, fmt.Errorf("replicas %d within %v: want n ≥ 1 and a positive timeout", r.Replicas, r.Timeout))
	}
	return errors.Join(errs...)
}

// String is the mode's name: "auto", "sharded", "classic" or "off".
func (m PubSubMode) String() string { return redisnotify.Mode(m).String() }
