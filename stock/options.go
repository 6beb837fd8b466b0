package stock

import (
	"time"

	"github.com/oncekit/oncekit/core/observe"
)

// Option configures a Stock.
type Option func(*Stock)

// Defaults of the options.
const (
	// DefaultMemory is how long a key's answer is kept: 24 h, as the
	// idempotency records' (idem.AttemptMemory).
	DefaultMemory = 24 * time.Hour
	// DefaultMaxMerge is how many operations on one item one store call
	// carries at most.
	DefaultMaxMerge = 256
	// DefaultTimeout bounds a merged store call whose callers' contexts
	// have no deadline.
	DefaultTimeout = 10 * time.Second
)

// WithMemory sets how long a take's answer (or a hold's, from its end) is
// kept, and so how long a retry with the same key gets it instead of
// taking again: DefaultMemory (24 h) by default. Keep it at least as long
// as clients retry.
func WithMemory(d time.Duration) Option { return func(s *Stock) { s.memory = d } }

// WithMaxMerge sets how many concurrent operations on one item this Stock
// merges into one store call: DefaultMaxMerge (256) by default; 1 sends
// each alone.
func WithMaxMerge(n int) Option { return func(s *Stock) { s.maxMerge = n } }

// WithMergeWait makes a store call wait d for more operations on its item
// before it is sent: 0 by default (no wait: the next call carries the
// operations that arrived while the last one was in flight, and those its
// answers' callers sent straight away — it goes out once the goroutines
// ready to run have had their turn, runtime.Gosched).
func WithMergeWait(d time.Duration) Option { return func(s *Stock) { s.mergeWait = d } }

// WithTimeout bounds a merged store call whose callers' contexts have no
// deadline: DefaultTimeout by default.
func WithTimeout(d time.Duration) Option { return func(s *Stock) { s.timeout = d } }

// WithObserver sets where the Stock reports its operations by outcome
// (observe.StockTake …), each store call with its merge size
// (observe.StockApply) and the holds that ran out (observe.StockExpired):
// by default the store's own Observer when it is an observe.Source (every
// oncekit driver is), else none. WithObserver(nil) turns reporting off.
func WithObserver(o observe.Observer) Option {
	return func(s *Stock) { s.observer, s.observed = o, true }
}
