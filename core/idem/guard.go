package idem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/internal/bounds"
	"github.com/oncekit/oncekit/core/internal/ctxbound"
	"github.com/oncekit/oncekit/core/internal/idemerr"
	"github.com/oncekit/oncekit/core/internal/runflags"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/observe"
)

// Defaults of a Guard.
const (
	defaultTTL       = 10 * time.Second
	defaultRetention = 24 * time.Hour
	defaultMaxResult = 1 << 20
)

// Option configures a Guard.
type Option func(*Guard)

// WithTTL sets how long an in-flight claim stays valid without an
// extension (its TTL); a watchdog extends it
// every third of it while the run is busy, so it only bounds how long a
// crashed run blocks its retries. Default 10 s.
func WithTTL(d time.Duration) Option { return func(g *Guard) { g.ttl = d } }

// WithRetention sets how long a completed result is kept and replayed.
// Default 24 h.
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
// to duplicates (a validation failure, say: only its message is stored, and Do
// reports it with replayed set), instead of
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
	store     idemdriver.Store
	ttl       time.Duration
	retention time.Duration
	maxResult int
	wait      time.Duration
	final     func(error) bool
	observer  observe.Observer
	observed  bool
	driver    string
	watchdog  watchdog // extends the claims of busy runs
	inFlight  atomic.Int64
}

// InFlight returns how many runs of this Guard hold their claim now: the
// work this process is doing under idempotency (promobs.Observer.WatchGuard
// exports it as a gauge).
func (g *Guard) InFlight() int64 { return g.inFlight.Load() }

// NewGuard returns a Guard over store.
func NewGuard(store idemdriver.Store, opts ...Option) (*Guard, error) {
	if store == nil {
		return nil, errors.New("idem: NewGuard: nil store")
	}
	g := &Guard{store: store, ttl: defaultTTL, retention: defaultRetention, maxResult: defaultMaxResult}
	for _, o := range opts {
		o(g)
	}
	var errs []error
	if err := bounds.TTL(g.ttl); err != nil {
		errs = append(errs, fmt.Errorf("TTL: %w", err))
	}
	if err := bounds.TTL(g.retention); err != nil {
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
func beginOutcome(c idemdriver.Claim, err error) observe.Outcome {
	switch {
	case err == nil && c.State == idemdriver.Acquired:
		return observe.Acquired
	case err == nil && c.State == idemdriver.Completed:
		return observe.Replayed
	case errors.Is(err, ErrInFlight):
		return observe.InFlight
	case errors.Is(err, ErrMismatch):
		return observe.Mismatch
	case errors.Is(err, lock.ErrInvalidKey):
		return observe.Invalid
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return observe.Canceled
	}
	return observe.Error
}

// Do runs run once for key and fingerprint, and returns its result. A duplicate gets the stored result
// with replayed set; one that arrives while the first run is in flight gets
// ErrInFlight with a retry hint (idemdriver.RetryAfter), or waits (WithWait); one with another fingerprint gets
// ErrMismatch.
//
// run's context carries the claim's fence (FenceFrom) and is cancelled,
// with lock.ErrLockLost as its cause, if the claim is lost while it runs: the
// store says so, or its lease could not be extended in time. The Guard's
// own timer ends the context a little before the claim's validity — the
// lease counted from before the request that granted or last extended it,
// or the store's Claim.Expires when earlier — so a run cut off from its
// store stops before another process can claim the key, however long its
// extension hangs. When run fails,
// the claim is abandoned so that a retry runs again, unless the error is
// final (WithFinalErrors). A run that panics abandons the claim and the
// panic goes on. When the claim was lost, Do returns lock.ErrLockLost and the
// result is not stored. A nil run only looks the key up: a duplicate gets
// its replay as usual, and a free key an error (the claim is given back).
//
// An error that came from the store rather than from run — a server that
// could not be reached, a corrupt record, a claim lost, a result that
// could not be stored — is a *StoreError (errors.Is(err, ErrStore)); run's
// own error comes back as run returned it, and the application's answers
// (ErrInFlight, ErrMismatch, ErrEffectRefused) are neither.
//
// key is 1 to lock.MaxKeyLen bytes, else lock.ErrInvalidKey.
func (g *Guard) Do(ctx context.Context, key, fingerprint string,
	run func(ctx context.Context) ([]byte, error)) (result []byte, replayed bool, err error) {
	k, err := idemdriver.CheckKey(key)
	if err != nil {
		_, call := observe.Begin(ctx, g.observer, observe.IdemBegin, g.driver, key)
		call.End(observe.Invalid, 0, err)
		return nil, false, err
	}
	return g.do(ctx, k, fingerprint, run)
}

// do is Do for a checked key.
func (g *Guard) do(ctx context.Context, key idemdriver.Key, fingerprint string,
	run func(ctx context.Context) ([]byte, error)) (result []byte, replayed bool, err error) {
	octx, call := observe.Begin(ctx, g.observer, observe.IdemBegin, g.driver, key.String())
	c, sent, err := g.begin(octx, key, fingerprint)
	if err != nil || c.State == idemdriver.Acquired {
		outcome := beginOutcome(c, err)
		call.End(outcome, c.Fence, err)
		if err != nil {
			if outcome == observe.Error {
				err = storeErr("begin", key, err)
			}
			return nil, false, err
		}
		if run == nil { // nothing to run: give the claim back rather than panic
			cctx, cancel := ctxbound.Cleanup(ctx)
			defer cancel()
			_ = g.abandon(cctx, c)
			return nil, false, errors.New("idem: Do claimed the key but has no run function")
		}
		return g.run(ctx, c, g.validity(c, sent), run)
	}
	res, err := decodeOutcome(key.String(), c.Result)
	if errors.Is(err, ErrCorruptRecord) {
		call.End(observe.Error, 0, err)
		return nil, false, storeErr("begin", key, err)
	}
	call.End(observe.Replayed, 0, nil)
	return res, true, err // err: a stored final error (its message)
}

// validity is when claim c, acquired by a Begin sent at sent, may be
// claimed by someone else at the earliest: the lease counted from before
// the request, or the store's own Expires when that is earlier.
func (g *Guard) validity(c idemdriver.Claim, sent time.Time) time.Time {
	valid := sent.Add(g.ttl)
	if !c.Expires.IsZero() && c.Expires.Before(valid) {
		valid = c.Expires
	}
	return valid
}

// storeBegin sends one Begin. Under ClaimOutlivesCaller it goes under a
// context that keeps ctx's values but ends only idemdriver.ClaimTimeout from now —
// a store may then make the request on this goroutine rather than hand it
// to another one that lets the caller leave at once — and a claim taken
// for a caller that has left meanwhile is given back before it returns
// ctx's error.
func (g *Guard) storeBegin(ctx context.Context, key idemdriver.Key, fingerprint string) (idemdriver.Claim, error) {
	if ctx.Done() == nil || !runflags.OutlivesCaller(ctx) {
		return g.store.Begin(ctx, key, fingerprint, g.ttl)
	}
	bctx, cancel := ctxbound.Bounded(ctx, time.Now().Add(idemdriver.ClaimTimeout))
	c, err := g.store.Begin(bctx, key, fingerprint, g.ttl)
	cancel()
	if cerr := ctx.Err(); cerr != nil {
		if err == nil && c.State == idemdriver.Acquired {
			cleanup, cancelCleanup := ctxbound.Cleanup(ctx)
			_ = g.abandon(cleanup, c)
			cancelCleanup()
		}
		return idemdriver.Claim{}, cerr
	}
	return c, err
}

// begin claims key, waiting for an in-flight run WithWait. It returns an
// Acquired or a Completed claim and when the Begin that answered was sent,
// or an error.
func (g *Guard) begin(ctx context.Context, key idemdriver.Key, fingerprint string) (idemdriver.Claim, time.Time, error) {
	if err := key.Check(); err != nil {
		return idemdriver.Claim{}, time.Time{}, err
	}
	deadline := time.Now().Add(runflags.Wait(ctx, g.wait))
	backoff := 5 * time.Millisecond
	for {
		sent := time.Now()
		c, err := g.storeBegin(ctx, key, fingerprint)
		if err != nil {
			return idemdriver.Claim{}, sent, err
		}
		switch c.State {
		case idemdriver.Acquired, idemdriver.Completed:
			return c, sent, nil
		case idemdriver.Mismatch:
			return idemdriver.Claim{}, sent, fmt.Errorf("%w: %q", ErrMismatch, key)
		case idemdriver.InFlight:
			if !time.Now().Before(deadline) {
				return idemdriver.Claim{}, sent, &idemerr.InFlight{Key: key.String(), RetryAfter: max(0, time.Until(c.Expires))}
			}
			wctx, cancel := context.WithDeadline(ctx, deadline)
			if w, ok := g.store.(idemdriver.Waiter); ok {
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
				return idemdriver.Claim{}, sent, ctx.Err()
			}
			if err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
				return idemdriver.Claim{}, sent, err // the store is closing
			}
			// The wait's deadline passed or the key changed: look again.
		default:
			return idemdriver.Claim{}, sent, fmt.Errorf("idem: %q: store answered state %d", key, c.State)
		}
	}
}

func (g *Guard) run(ctx context.Context, c idemdriver.Claim, valid time.Time, run func(context.Context) ([]byte, error)) (result []byte, replayed bool, err error) {
	g.inFlight.Add(1)
	defer g.inFlight.Add(-1)
	// One allocation for the run's values and its watchdog entry: both
	// live exactly as long as the run.
	st := &runState{vals: runValues{Context: ctx, fence: c.Fence, key: c.Key.String(), attempt: c.Attempt}}
	slot := &st.vals.slot
	rctx, cancel := context.WithCancelCause(&st.vals)
	defer cancel(nil)
	// The claim lives until run returns, whatever happens to the caller's
	// context: a client that hangs up must not free the key while its
	// handler still runs.
	wd := g.watch(rctx, &st.watched, c, valid, cancel)
	// giveBack abandons the claim under a clean-up context made when it
	// is needed: a fresh ReleaseTimeout however long run took, and no timer
	// on the path that completes.
	giveBack := func() error {
		cleanup, cancelCleanup := ctxbound.Cleanup(ctx)
		defer cancelCleanup()
		return g.abandon(cleanup, c)
	}

	returned := false
	defer func() {
		if returned {
			return
		}
		// run panicked, or called runtime.Goexit (t.FailNow, say): give
		// the key back at once rather than at the end of its lease.
		p := recover()
		wd.stop()
		_ = giveBack()
		if p != nil {
			panic(p)
		}
	}()
	res, runErr := run(rctx)
	returned = true
	valid = wd.stop()
	effect := slot.take()

	if errors.Is(context.Cause(rctx), lock.ErrLockLost) {
		observe.Record(ctx, g.observer, observe.Event{
			Op: observe.IdemLost, Driver: g.driver, Key: c.Key.String(), Outcome: observe.Lost, Fence: c.Fence, Err: lock.ErrLockLost,
		})
		return nil, false, errors.Join(storeErr("run", c.Key, fmt.Errorf("idem: %q: claim lost while running: %w", c.Key, lock.ErrLockLost)), runErr)
	}
	if runErr != nil && (g.final == nil || !g.final(runErr)) {
		if err := giveBack(); err != nil && !errors.Is(err, lock.ErrLockLost) {
			return nil, false, errors.Join(runErr, storeErr("abandon", c.Key, err))
		}
		return nil, false, runErr
	}
	enc := encodeOutcome(res, runErr)
	if len(enc)-2 > g.maxResult {
		_ = giveBack()
		return nil, false, fmt.Errorf("%w: %d bytes, limit %d", ErrResultTooLarge, len(enc)-2, g.maxResult)
	}
	if err := g.complete(ctx, c, enc, valid, effect); err != nil {
		if refusedCompletion(err) {
			_ = giveBack() // still ours, and nothing was written
		}
		if finishOutcome(observe.Stored, err) != observe.Refused && !errors.Is(err, ErrEffectUnsupported) && !errors.Is(err, ErrResultTooLarge) {
			err = storeErr("complete", c.Key, err)
		}
		return nil, false, err
	}
	if runErr != nil {
		return nil, false, runErr // stored as final; duplicates get its message, replayed
	}
	return res, false, nil
}

// complete stores the outcome, with the run's effect if it committed one.
// A Complete that fails for a reason other than an answer (a lost claim, a
// corrupt record, an effect refused or failed) — a store that is briefly
// unreachable — is retried with jittered backoff while the claim
// is still valid (valid: the end of its lease as last extended): the work
// is done, and a claim left in flight would run it again once its lease
// ran out. A retry that finds the claim gone checks whether the earlier
// attempt had in fact stored the outcome (only its reply was lost).
func (g *Guard) complete(ctx context.Context, c idemdriver.Claim, enc []byte, valid time.Time, effect any) error {
	es, _ := g.store.(idemdriver.EffectStore)
	if effect != nil && es == nil {
		return fmt.Errorf("idem: %q: %T cannot commit an effect: %w", c.Key, g.store, ErrEffectUnsupported)
	}
	backoff := 10 * time.Millisecond
	for retried := false; ; retried = true {
		deadline := time.Now().Add(bounds.Cleanup)
		if valid.After(deadline) {
			deadline = valid
		}
		cctx, cancel := ctxbound.Bounded(ctx, deadline)
		cctx, call := observe.Begin(cctx, g.observer, observe.IdemComplete, g.driver, c.Key.String())
		var err error
		if effect != nil {
			err = es.CompleteWith(cctx, c, enc, g.retention, effect)
		} else {
			err = g.store.Complete(cctx, c, enc, g.retention)
		}
		call.End(finishOutcome(observe.Stored, err), c.Fence, err)
		if retried && errors.Is(err, lock.ErrLockLost) && g.storedAlready(cctx, c, enc) {
			err = nil
		}
		cancel()
		if err == nil || errors.Is(err, lock.ErrLockLost) || errors.Is(err, ErrCorruptRecord) || refusedCompletion(err) {
			return err // an answer, not a fault: asking again gets the same
		}
		wait := backoff/2 + rand.N(backoff/2+1)
		if !time.Now().Add(wait).Before(valid) {
			return fmt.Errorf("idem: %q: result not stored before the claim's lease ran out: %w", c.Key, err)
		}
		time.Sleep(wait)
		backoff = min(2*backoff, g.ttl/4)
	}
}

// refusedCompletion reports a completion the store answered with a refusal
// that leaves the claim ours and the record not written: the effect
// refused, unsupported or failed, the result over the store's own limit.
func refusedCompletion(err error) bool {
	return errors.Is(err, ErrEffectRefused) || errors.Is(err, ErrEffectUnsupported) ||
		errors.Is(err, ErrEffectFailed) || errors.Is(err, ErrResultTooLarge)
}

// storedAlready reports whether key's record is completed with enc: an
// earlier Complete whose reply was lost did store it.
func (g *Guard) storedAlready(ctx context.Context, c idemdriver.Claim, enc []byte) bool {
	got, err := g.store.Begin(ctx, c.Key, c.Fingerprint, g.ttl)
	if err != nil {
		return false
	}
	if got.State == idemdriver.Acquired { // the record is gone: give the fresh claim back
		_ = g.store.Abandon(ctx, got)
		return false
	}
	return got.State == idemdriver.Completed && bytes.Equal(got.Result, enc)
}

// abandon drops c's claim, reporting it.
func (g *Guard) abandon(ctx context.Context, c idemdriver.Claim) error {
	ctx, call := observe.Begin(ctx, g.observer, observe.IdemAbandon, g.driver, c.Key.String())
	err := g.store.Abandon(ctx, c)
	call.End(finishOutcome(observe.Abandoned, err), c.Fence, err)
	return err
}

func finishOutcome(ok observe.Outcome, err error) observe.Outcome {
	switch {
	case err == nil:
		return ok
	case errors.Is(err, lock.ErrLockLost):
		return observe.Lost
	case errors.Is(err, ErrEffectRefused):
		return observe.Refused // the application's answer, not the store failing
	}
	return observe.Error
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
		msg := final.Error()
		return append(append(make([]byte, 0, 2+len(msg)), outcomeVersion, kindError), msg...)
	}
	return append(append(make([]byte, 0, 2+len(res)), outcomeVersion, kindResult), res...)
}

func decodeOutcome(key string, b []byte) ([]byte, error) {
	if len(b) < 2 || b[0] != outcomeVersion {
		return nil, &idemerr.Corrupt{Key: key, Reason: "unknown outcome encoding"}
	}
	switch b[1] {
	case kindResult:
		return b[2:], nil
	case kindError:
		return nil, &idemerr.Replayed{Message: string(b[2:])}
	}
	return nil, &idemerr.Corrupt{Key: key, Reason: fmt.Sprintf("unknown outcome kind %d", b[1])}
}
