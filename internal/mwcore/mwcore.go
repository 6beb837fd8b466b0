package mwcore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/lock"
)

// Config is the configuration every middleware shares. The zero value
// has no key space chosen yet.
type Config struct {
	scopes   int // WithScope and Unscoped given
	wait     time.Duration
	waitSet  bool
	failOpen bool
	errs     []error
}

// ChooseScope records a WithScope or an Unscoped: exactly one of them must
// be given (Check), so that a shared key space is never a silent default.
func (c *Config) ChooseScope() { c.scopes++ }

// SetWait overrides the Guard's wait (idem.WithWait) for this middleware's
// requests.
func (c *Config) SetWait(d time.Duration) {
	if d < 0 {
		c.errs = append(c.errs, fmt.Errorf("negative wait %v", d))
	}
	c.wait, c.waitSet = d, true
}

// SetFailOpen makes an unreachable store run the handler without
// idempotency instead of refusing the request.
func (c *Config) SetFailOpen() { c.failOpen = true }

// FailOpen reports whether the store unreachable runs the handler.
func (c *Config) FailOpen() bool { return c.failOpen }

// Fail records a bad option.
func (c *Config) Fail(err error) { c.errs = append(c.errs, err) }

// Check returns every problem of the configuration, joined (nil for none).
func (c *Config) Check() error {
	errs := c.errs
	if c.scopes != 1 {
		errs = append(errs, errors.New("choose the key space once: WithScope(principal) or Unscoped()"))
	}
	return errors.Join(errs...)
}

// Context is ctx with the wait override, when one was set.
func (c *Config) Context(ctx context.Context) context.Context {
	if c.waitSet {
		return idemdriver.ContextWithWait(ctx, c.wait)
	}
	return ctx
}

// Refusal is why a Guard neither ran a request nor replayed it.
type Refusal int

const (
	// InFlight: a request with the key is still running (RetryAfter says
	// for how long at most).
	InFlight Refusal = iota
	// Mismatch: the key was used for another request.
	Mismatch
	// InvalidKey: the key is out of bounds.
	InvalidKey
	// CorruptRecord: the stored record cannot be read.
	CorruptRecord
	// Canceled: the caller went away.
	Canceled
	// FailOpen: the store did not answer and the middleware runs the
	// handler without idempotency.
	FailOpen
	// StoreDown: the store did not answer; nothing was run.
	StoreDown
)

// Refused reads err, the error of a Guard.Do that did not run its run and
// replayed nothing, under ctx (the request's).
func (c *Config) Refused(ctx context.Context, err error) (Refusal, time.Duration) {
	switch after, hinted := idemdriver.RetryAfter(err); {
	case hinted:
		return InFlight, max(after, 0)
	case errors.Is(err, idem.ErrInFlight):
		return InFlight, 0
	case errors.Is(err, idem.ErrMismatch):
		return Mismatch, 0
	case errors.Is(err, lock.ErrInvalidKey):
		return InvalidKey, 0
	case errors.Is(err, idem.ErrCorruptRecord):
		return CorruptRecord, 0
	case ctx.Err() != nil:
		return Canceled, 0
	case c.failOpen:
		return FailOpen, 0
	}
	return StoreDown, 0
}

// Unsettled is why a run's outcome was not committed.
type Unsettled int

const (
	// Lost: the claim was lost while the run ran; a retry with the key
	// runs again.
	Lost Unsettled = iota
	// EffectRefused: the effect's own check refused it; nothing was done.
	EffectRefused
	// NotCommitted: the store answered that the outcome cannot be kept
	// (too large, an effect that failed): nothing was done, and the same
	// request would meet the same answer.
	NotCommitted
	// Unreachable: the store did not answer the completion; nothing is
	// known to be committed, and a retry with the key is the way on.
	Unreachable
)

// UnsettledBy reads err, the error of a Guard.Do whose run ran and whose
// outcome was not stored for a reason of the store's (not the run's own).
func UnsettledBy(err error) Unsettled {
	switch {
	case errors.Is(err, lock.ErrLockLost):
		return Lost
	case errors.Is(err, idem.ErrEffectRefused):
		return EffectRefused
	case errors.Is(err, idem.ErrEffectFailed), errors.Is(err, idem.ErrResultTooLarge), errors.Is(err, idem.ErrEffectUnsupported):
		return NotCommitted
	}
	return Unreachable
}
