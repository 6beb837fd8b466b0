package idemerr

import (
	"errors"
	"fmt"
	"time"
)

// ErrCorruptRecord is idem.ErrCorruptRecord.
var ErrCorruptRecord = errors.New("idem: corrupt record")

// Corrupt names the key whose record could not be read, and why.
type Corrupt struct{ Key, Reason string }

func (e *Corrupt) Error() string {
	return fmt.Sprintf("idem: corrupt record under %q: %s", e.Key, e.Reason)
}

// Unwrap returns ErrCorruptRecord.
func (e *Corrupt) Unwrap() error { return ErrCorruptRecord }

// ErrInFlight is idem.ErrInFlight.
var ErrInFlight = errors.New("idem: request in flight")

// InFlight is a duplicate of a request still running, with a hint for
// when to try again.
type InFlight struct {
	Key        string
	RetryAfter time.Duration
}

func (e *InFlight) Error() string {
	return fmt.Sprintf("idem: %q is in flight; retry after %s", e.Key, e.RetryAfter.Round(time.Millisecond))
}

// Unwrap returns ErrInFlight.
func (e *InFlight) Unwrap() error { return ErrInFlight }

// Replayed is a run's final error, stored and replayed to duplicates
// (idem.WithFinalErrors): only its message survives storage.
type Replayed struct{ Message string }

func (e *Replayed) Error() string { return e.Message }
