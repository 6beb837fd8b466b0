package idem

import (
	"errors"
	"fmt"

	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/internal/idemerr"
)

// ErrInFlight reports a duplicate that arrived while the first run of its
// key is still in flight. The error carries a retry hint
// (idemdriver.RetryAfter).
var ErrInFlight = idemerr.ErrInFlight

// ErrMismatch reports a key reused with another fingerprint: the same
// idempotency key for a different request.
var ErrMismatch = errors.New("idem: key reused with another request")

// ErrCorruptRecord reports a stored record that is not one this package
// wrote (unknown version, truncated): it is never read as absent. The
// error names the key (idemdriver.CorruptRecordOf).
var ErrCorruptRecord = idemerr.ErrCorruptRecord

// ErrUnknownLayout reports a stored record of a layout this version cannot
// judge: written by a later version (during a rolling deploy), or by an
// earlier one whose layout this version no longer reads. Such a record is
// never taken over, nor read as absent or corrupt: Begin answers this
// error (the middlewares answer it as the store's fault, and a Kafka
// message is retried, never dead-lettered) until the record expires or
// every replica runs a version that reads it. Every layout a released
// version writes is read by every later version (CONTRIBUTING.md).
var ErrUnknownLayout = errors.New("idem: record of a layout this version does not read")

// ErrResultTooLarge reports a result over the Guard's size limit, or over
// the store's own (a driver's Complete may return it): the claim is
// abandoned and nothing is stored, an effect included.
var ErrResultTooLarge = errors.New("idem: result too large")

// ErrStore matches every error of Guard.Do that came from the store, not
// from the run: a server that could not be reached or did not answer in
// time, a closed Store, a corrupt record, a claim the store no longer
// holds, a result that could not be stored. The error is a *StoreError
// naming the step. The middlewares answer these as the store's fault
// (HTTP 503, gRPC Unavailable; a Kafka message is retried); a run's own
// error comes back as the run returned it, and the application's answers
// (ErrInFlight, ErrMismatch, ErrEffectRefused) are not store errors.
var ErrStore = errors.New("idem: store failed")

// StoreError is an error of the store under Guard.Do. It matches ErrStore
// and unwraps to the driver's error, so errors.Is still finds
// ErrCorruptRecord, lock.ErrLockLost or a context's error inside it.
type StoreError struct {
	// Op is the Guard's step: "begin" (claiming or waiting), "complete"
	// (storing the result, with its effect), "abandon" (giving the claim
	// back after the run failed) or "run" (the claim was lost while the
	// run went on).
	Op  string
	Key string
	Err error
}

func (e *StoreError) Error() string { return e.Err.Error() }

// Unwrap returns ErrStore and the store's error: errors.Is and errors.As
// see both.
func (e *StoreError) Unwrap() []error { return []error{ErrStore, e.Err} }

// storeErr wraps a store's error of step op (nil stays nil).
func storeErr(op string, key idemdriver.Key, err error) error {
	if err == nil {
		return nil
	}
	return &StoreError{Op: op, Key: key.String(), Err: err}
}

// ErrEffectUnsupported reports an effect (Commit) the store cannot commit
// with a record: the store is not an EffectStore, or the effect is not of
// its driver's type. Nothing is written; the claim is abandoned.
var ErrEffectUnsupported = errors.New("idem: effect not supported by this store")

// ErrEffectRefused reports an effect whose own condition refused it (too
// little stock, say): neither the effect nor the record was written, and
// the claim is abandoned so that a retry runs again. The error is an
// *EffectRefusedError with the effect's reason.
var ErrEffectRefused = errors.New("idem: effect refused")

// EffectRefusedError carries the reason an effect gave for refusing. It
// matches ErrEffectRefused.
type EffectRefusedError struct {
	Key    string
	Reason string
}

func (e *EffectRefusedError) Error() string {
	return fmt.Sprintf("idem: %q: effect refused: %s", e.Key, e.Reason)
}

// Is reports whether target is ErrEffectRefused.
func (e *EffectRefusedError) Is(target error) bool { return target == ErrEffectRefused }

// ErrEffectFailed reports an effect that the store ran and that failed
// with an answer rather than a fault: a Redis script's error reply
// (WRONGTYPE, redis.error_reply), an etcd transaction the server rejected.
// Asking again would get the same answer, so the Guard does not retry it:
// it abandons the claim and returns the error, an *EffectFailedError. The
// record was not completed; writes the effect made before it failed may
// remain where the store cannot roll them back (Redis scripts), which is
// why an effect must check before it writes.
var ErrEffectFailed = errors.New("idem: effect failed")

// EffectFailedError carries the store's answer to a failed effect. It
// matches ErrEffectFailed and unwraps to the store's error.
type EffectFailedError struct {
	Key string
	Err error
}

func (e *EffectFailedError) Error() string {
	return fmt.Sprintf("idem: %q: effect failed: %v", e.Key, e.Err)
}

// Unwrap returns ErrEffectFailed and the store's error: errors.Is and
// errors.As see both.
func (e *EffectFailedError) Unwrap() []error { return []error{ErrEffectFailed, e.Err} }
