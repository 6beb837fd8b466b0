package idem

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/oncekit/oncekit/core/lock/lockdriver"
	"github.com/oncekit/oncekit/core/observe"
)

// Defaults of a Guard.
const (
	DefaultLease     = 10 * time.Second
	DefaultRetention = 24 * time.Hour
	DefaultMaxResult = 1 << 20
)

// Option configures a Guard.
type Option func(*Guard)

// WithLease sets the lease of an in-flight claim; a watchdog extends it
// every lease/3 while the run is busy, so it only bounds how long a crashed
// run blocks its retries. Default DefaultLease (10 s).
func WithLease(d time.Duration) Option { return func(g *Guard) { g.lease = d } }

// WithRetention sets how long a completed result is kept and replayed.
// Default DefaultRetention (24 h).
func WithRetention(d time.Duration) Option { return func(g *Guard) { g.retention = d } }

// WithMaxResult sets the largest result, in bytes, that is stored; a larger
// one fails with ErrResultTooLarge and is not stored. Default 1 MiB.
func WithMaxResult(n int) Option { return func(g *Guard) { g.maxResult = n } }

// WithWait makes a duplicate that finds its key in flight wait up to d for
// the result instead of failing with ErrInFlight at once. It is woken by the
// store's completion signal when the store offers one (Waiter), else it
// re-checks with jittered backoff. Default 0: no waiting.
func WithWait(d time.Duration) Option { return func(g *Guard) { g.wait = d } }

// WithFinalErrors sets which errors of a run are final: stored and replayed
// to duplicates as a *ReplayedError (a validation failure, say), instead of
// abandoning the claim so that a retry runs again. Default: none is final.
func WithFinalErrors(final func(error) bool) Option { return func(g *Guard) { g.final = final } }

// WithObserver sets where the Guard reports claims by outcome, completions,
// abandonments and lost claims (see package observe). Default: the store's
// own Observer when it is an observe.Source (every oncekit driver is), else
// none. WithObserver(nil) turns reporting off.
func WithObserver(o observe.Observer) Option {
	return func(g *Guard) { g.observer, g.observed = o, true }
}

// Guard runs a function once per key across every process that shares the
// Store, and replays its stored result to duplicates.
type Guard struct {
	store     Store
	lease     time.Duration
	retention time.Duration
	maxResult int
	wait      time.Duration
	final     func(error) bool
	observer  observe.Observer
	observed  bool
	driver    string
}

// NewGuard returns a Guard over store.
func NewGuard(store Store, opts ...Option) (*Guard, error) {
	if store == nil {
		return nil, errors.New("idem: NewGuard: nil store")
	}
	g := &Guard{store: store, lease: DefaultLease, retention: DefaultRetention, maxResult: DefaultMaxResult}
	for _, o := range opts {
		o(g)
	}
	var errs []error
	if err := lockdriver.ValidateTTL(g.lease); err != nil {
		errs = append(errs, fmt.Errorf("lease: %w", err))
	}
	if err := lockdriver.ValidateTTL(g.retention); err != nil {
		errs = append(errs, fmt.Errorf("retention: %w", err))
	}
	if g.maxResult < 0 || g.wait < 0 {
		errs = append(errs, errors.New("negative result limit or wait"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("idem: NewGuard: %w", err)
	}
	if !g.observed {
		g.observer = observe.ObserverOf(store)
	}
	g.driver = observe.DriverOf(store)
	return g, nil
}

// Observer returns the Observer the Guard reports to (nil for none), for
// middleware built on the Guard to report its own events alongside.
func (g *Guard) Observer() observe.Observer { return g.observer }

// DriverName returns the name of the Guard's store driver ("" when the
// store does not say).
func (g *Guard) DriverName() string { return g.driver }

// beginOutcome classifies how a Do's claim ended for the observer.
func beginOutcome(c Claim, err error) observe.Outcome {
	switch {
	case err == nil && c.State == Acquired:
		return observe.Acquired
	case err == nil && c.State == Completed:
		return observe.Replayed
	case errors.Is(err, ErrInFlight):
		return observe.InFlight
	case errors.Is(err, ErrMismatch):
		return observe.Mismatch
	case errors.Is(err, ErrInvalidKey):
		return observe.Invalid
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return observe.Canceled
	}
	return observe.Error
}

// Do runs run once for key (already scoped, see ScopedKey) and
// fingerprint, and returns its result. A duplicate gets the stored result
// with replayed set; one that arrives while the first run is in flight gets
// an *InFlightError (or waits, WithWait); one with another fingerprint gets
// ErrMismatch.
//
// run's context carries the claim's fence (FenceFrom) and is cancelled,
// with ErrLockLost as its cause, if the claim is lost while it runs (its
// lease could not be extended). When run fails,
// the claim is abandoned so that a retry runs again, unless the error is
// final (WithFinalErrors). A run that panics abandons the claim and the
// panic goes on. When the claim was lost, Do returns ErrLockLost and the
// result is not stored.
func (g *Guard) Do(ctx context.Context, key, fingerprint string,
	run func(ctx context.Context) ([]byte, error)) (result []byte, replayed bool, err error) {
	octx, call := observe.Begin(ctx, g.observer, observe.IdemBegin, g.driver, key)
	c, err := g.begin(octx, key, fingerprint)
	if err != nil || c.State == Acquired {
		call.End(beginOutcome(c, err), c.Fence, err)
		if err != nil {
			return nil, false, err
		}
		return g.run(ctx, c, run)
	}
	res, err := decodeOutcome(key, c.Result)
	if errors.Is(err, ErrCorruptRecord) {
		call.End(observe.Error, 0, err)
		return nil, false, err
	}
	call.End(observe.Replayed, 0, nil)
	return res, true, err // err: a stored final error, as a *ReplayedError
}

// begin claims key, waiting for an in-flight run WithWait. It returns an
// Acquired or a Completed claim, or an error.
func (g *Guard) begin(ctx context.Context, key, fingerprint string) (Claim, error) {
	if err := lockdriver.ValidateKey(key); err != nil {
		return Claim{}, err
	}
	deadline := time.Now().Add(waitOf(ctx, g.wait))
	backoff := 5 * time.Millisecond
	for {
		c, err := g.store.Begin(ctx, key, fingerprint, g.lease)
		if err != nil {
			return Claim{}, err
		}
		switch c.State {
		case Acquired, Completed:
			return c, nil
		case Mismatch:
			return Claim{}, fmt.Errorf("%w: %q", ErrMismatch, key)
		case InFlight:
			if !time.Now().Before(deadline) {
				return Claim{}, &InFlightError{Key: key, RetryAfter: max(0, time.Until(c.Expires))}
			}
			wctx, cancel := context.WithDeadline(ctx, deadline)
			if w, ok := g.store.(Waiter); ok {
				err = w.WaitChange(wctx, key, c.Expires)
			} else {
				t := time.NewTimer(rand.N(backoff) + backoff/2)
				select {
				case <-t.C:
				case <-wctx.Done():
					err = wctx.Err()
				}
				t.Stop()
				backoff = min(2*backoff, 250*time.Millisecond)
			}
			cancel()
			if ctx.Err() != nil {
				return Claim{}, ctx.Err()
			}
			_ = err // the deadline passed or the key changed: look again
		default:
			return Claim{}, fmt.Errorf("idem: %q: store answered state %d", key, c.State)
		}
	}
}

func (g *Guard) run(ctx context.Context, c Claim, run func(context.Context) ([]byte, error)) (result []byte, replayed bool, err error) {
	rctx, cancel := context.WithCancelCause(context.WithValue(ctx, fenceKey{}, c.Fence))
	defer cancel(nil)
	finish := g.watchdog(rctx, c, cancel)
	cleanup, cancelCleanup := lockdriver.CleanupContext(ctx)
	defer cancelCleanup()

	defer func() {
		if p := recover(); p != nil {
			finish()
			_ = g.abandon(cleanup, c)
			panic(p)
		}
	}()
	res, runErr := run(rctx)
	finish()

	if errors.Is(context.Cause(rctx), ErrLockLost) {
		observe.Record(ctx, g.observer, observe.Event{
			Op: observe.IdemLost, Driver: g.driver, Key: c.Key, Outcome: observe.Lost, Fence: c.Fence, Err: ErrLockLost,
		})
		return nil, false, errors.Join(fmt.Errorf("idem: %q: claim lost while running: %w", c.Key, ErrLockLost), runErr)
	}
	if runErr != nil && (g.final == nil || !g.final(runErr)) {
		if err := g.abandon(cleanup, c); err != nil && !errors.Is(err, ErrLockLost) {
			return nil, false, errors.Join(runErr, err)
		}
		return nil, false, runErr
	}
	enc := encodeOutcome(res, runErr)
	if len(enc)-2 > g.maxResult {
		_ = g.abandon(cleanup, c)
		return nil, false, fmt.Errorf("%w: %d bytes, limit %d", ErrResultTooLarge, len(enc)-2, g.maxResult)
	}
	cctx, call := observe.Begin(cleanup, g.observer, observe.IdemComplete, g.driver, c.Key)
	err = g.store.Complete(cctx, c, enc, g.retention)
	call.End(finishOutcome(observe.Stored, err), c.Fence, err)
	if err != nil {
		return nil, false, err
	}
	if runErr != nil {
		return nil, false, runErr // stored as final; duplicates get a *ReplayedError
	}
	return res, false, nil
}

// abandon drops c's claim, reporting it.
func (g *Guard) abandon(ctx context.Context, c Claim) error {
	ctx, call := observe.Begin(ctx, g.observer, observe.IdemAbandon, g.driver, c.Key)
	err := g.store.Abandon(ctx, c)
	call.End(finishOutcome(observe.Abandoned, err), c.Fence, err)
	return err
}

func finishOutcome(ok observe.Outcome, err error) observe.Outcome {
	switch {
	case err == nil:
		return ok
	case errors.Is(err, ErrLockLost):
		return observe.Lost
	}
	return observe.Error
}

// watchdog extends the claim every lease/3 until the returned stop is
// called; when it cannot and the lease has run out, or the store says the
// claim is lost, it cancels the run with ErrLockLost. It runs on timers
// (time.AfterFunc), so a run shorter than lease/3 — the common case —
// costs no goroutine. stop waits for an extension in progress.
func (g *Guard) watchdog(ctx context.Context, c Claim, cancel context.CancelCauseFunc) (stop func()) {
	interval := g.lease / 3
	var (
		mu      sync.Mutex
		stopped bool
		busy    sync.WaitGroup
		valid   = time.Now().Add(g.lease)
		t       *time.Timer
	)
	extend := func() {
		mu.Lock()
		if stopped {
			mu.Unlock()
			return
		}
		busy.Add(1)
		mu.Unlock()
		defer busy.Done()
		start := time.Now()
		ectx, ecancel := context.WithTimeout(ctx, interval)
		err := g.store.Extend(ectx, c, g.lease)
		ecancel()
		next := interval
		switch {
		case err == nil:
			valid = start.Add(g.lease)
		case errors.Is(err, ErrLockLost) || !time.Now().Before(valid):
			cancel(ErrLockLost)
			return
		case ctx.Err() != nil:
			return
		default:
			next = max(g.lease/10, time.Millisecond)
		}
		mu.Lock()
		if !stopped {
			t.Reset(next)
		}
		mu.Unlock()
	}
	mu.Lock()
	t = time.AfterFunc(interval, extend)
	mu.Unlock()
	return func() {
		mu.Lock()
		stopped = true
		t.Stop()
		mu.Unlock()
		busy.Wait()
	}
}

// Outcomes are stored as a version byte, a kind byte and the payload: the
// result, or a final error's message.
const (
	outcomeVersion = 1
	kindResult     = 0
	kindError      = 1
)

func encodeOutcome(res []byte, final error) []byte {
	if final != nil {
		return append([]byte{outcomeVersion, kindError}, final.Error()...)
	}
	return append([]byte{outcomeVersion, kindResult}, res...)
}

func decodeOutcome(key string, b []byte) ([]byte, error) {
	if len(b) < 2 || b[0] != outcomeVersion {
		return nil, &CorruptRecordError{Key: key, Reason: "unknown outcome encoding"}
	}
	switch b[1] {
	case kindResult:
		return b[2:], nil
	case kindError:
		return nil, &ReplayedError{Message: string(b[2:])}
	}
	return nil, &CorruptRecordError{Key: key, Reason: fmt.Sprintf("unknown outcome kind %d", b[1])}
}
