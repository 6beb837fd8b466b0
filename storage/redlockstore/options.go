package redlockstore

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

// The pub/sub modes; see redisstore for their meaning.
const (
	PubSubAuto PubSubMode = iota
	PubSubSharded
	PubSubClassic
	PubSubOff
)

// Option configures a Store.
type Option func(*options)

type options struct {
	rediskit.Options
	redlockOptions
}

// redlockOptions are the settings of a quorum of nodes.
type redlockOptions struct {
	nodeTimeout time.Duration // 0: derived from the TTL
	driftFactor float64
	driftFloor  time.Duration
	fenced      bool
	quorumWait  time.Duration // 0: until ctx ends
	linger      time.Duration
	maxHandOffs int
	maxHold     time.Duration
}

func defaultOptions() options {
	return options{
		Options: rediskit.Options{
			Prefix:       "oncekit:redlock:",
			RecordPrefix: "oncekit:redlock-idem:",
			PubSub:       redisnotify.Auto,
			Recheck:      time.Second,
			MinBackoff:   2 * time.Millisecond,
			MaxBackoff:   100 * time.Millisecond,
		},
		redlockOptions: redlockOptions{driftFactor: 0.01, driftFloor: 2 * time.Millisecond, fenced: true,
			linger: 100 * time.Microsecond, maxHandOffs: 16, maxHold: time.Millisecond},
	}
}

// WithPrefix sets the prefix of every Redis key and channel. It must not
// contain '{' or '}'. Default "oncekit:redlock:".
func WithPrefix(p string) Option { return func(o *options) { o.Prefix = p } }

// WithObserver sets where the Store reports hand-offs, and where the
// lock.Mutex and idem.Guard built on it report their operations (see
// package observe). Default: none.
func WithObserver(obs observe.Observer) Option { return func(o *options) { o.Observer = obs } }

// WithRecordPrefix sets the prefix of the idempotency records (idemdriver.Store).
// It must not contain '{' or '}'. Default "oncekit:redlock-idem:".
func WithRecordPrefix(p string) Option { return func(o *options) { o.RecordPrefix = p } }

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

// WithoutFencing takes keys without issuing fences (no clock check across
// the nodes either). Leases then report Fence() == 0. For callers that only need
// mutual exclusion; see the package documentation. Default: fenced.
func WithoutFencing() Option { return func(o *options) { o.fenced = false } }

// WithQuorumWait bounds how long Acquire keeps trying while a majority of
// the nodes cannot be reached: after d of failed rounds in a row it
// returns the *QuorumError (matching ErrNoQuorum and lock.ErrNotAcquired),
// naming each node's failure. Default 0: it tries until ctx ends.
func WithQuorumWait(d time.Duration) Option { return func(o *options) { o.quorumWait = d } }

// WithPubSub selects the release notification mechanism. Default PubSubAuto.
func WithPubSub(m PubSubMode) Option { return func(o *options) { o.PubSub = redisnotify.Mode(m) } }

// WithRecheckInterval bounds how long a waiter sleeps without a release
// message before trying again. Default 1 s.
func WithRecheckInterval(d time.Duration) Option { return func(o *options) { o.Recheck = d } }

// WithBackoff bounds the jittered backoff after a split vote (competing
// clients each took some nodes but none a majority) or a failed round.
// Default 2 ms to 100 ms.
func WithBackoff(min, max time.Duration) Option {
	return func(o *options) { o.MinBackoff, o.MaxBackoff = min, max }
}

// WithLinger sets how long a Release keeps a hot key's hold for this
// Store's next Acquire of it before releasing it on the nodes. A key is hot
// here when the Store asked for it again within 10 ms of letting it go (a
// loop, or a stream of requests for one item), and no kept hold of it went
// unused in the last 100 ms (two processes taking turns); its next Acquire
// then takes
// the key with no round: the same hold, with the hold's next fence
// (fenced mode) and the hold's validity, which must be at least
// 7/8 of the asked TTL. Within WithMaxLocalHandOffs and WithMaxLocalHold
// the key is then released, so that other processes get their turn.
//
// The price, for hot keys only: the key stays held for up to the linger
// after Release returns, so another process's TryAcquire may find it busy,
// and a process that exits in that moment without Close leaves it held
// until its TTL ends. Close releases kept holds. 0 turns it
// off. Default 100 µs.
func WithLinger(d time.Duration) Option { return func(o *options) { o.linger = d } }

// WithMaxLocalHandOffs and WithMaxLocalHold bound how long a kept hold
// (WithLinger) serves this Store's leases before the key is released so
// that other processes get their turn: n leases in a row, or as many as
// start within d after the Store took the key from the nodes, whichever is
// more (and at most 128 per fence settled, fenced mode). n = 0 turns kept
// holds off. A Store with kept holds scales the fence T each acquisition
// settles: its leases take 128T + 0, 1, … (fenced mode). Defaults 16 and
// 1 ms.
func WithMaxLocalHandOffs(n int) Option { return func(o *options) { o.maxHandOffs = n } }

// WithMaxLocalHold: see WithMaxLocalHandOffs.
func WithMaxLocalHold(d time.Duration) Option { return func(o *options) { o.maxHold = d } }

func (o *options) validate() error {
	errs := o.Options.Validate()
	if o.linger < 0 {
		errs = append(errs, fmt.Errorf("linger %s is negative", o.linger))
	}
	if o.maxHandOffs < 0 {
		errs = append(errs, fmt.Errorf("max local hand-offs %d is negative", o.maxHandOffs))
	}
	if o.maxHold < 0 {
		errs = append(errs, fmt.Errorf("max local hold %s is negative", o.maxHold))
	}
	if o.quorumWait < 0 {
		errs = append(errs, fmt.Errorf("quorum wait %s is negative", o.quorumWait))
	}
	if o.nodeTimeout < 0 {
		errs = append(errs, fmt.Errorf("node timeout %s is negative", o.nodeTimeout))
	}
	if o.driftFactor < 0 || o.driftFactor >= 0.5 || o.driftFloor < 0 {
		errs = append(errs, fmt.Errorf("drift %.3f×TTL+%s is out of range", o.driftFactor, o.driftFloor))
	}
	return errors.Join(errs...)
}

// String is the mode's name: "auto", "sharded", "classic" or "off".
func (m PubSubMode) String() string { return redisnotify.Mode(m).String() }
