package lock

import (
	"errors"
	"fmt"
	"time"

	"github.com/oncekit/oncekit/core/internal/bounds"
)

// ErrNotAcquired reports that a lock could not be taken: the key is held by
// someone else (TryAcquire) or the caller's context ended while waiting
// (Acquire, joined with ctx.Err()). A TryAcquire failure carries the
// holder's remaining TTL in a *BusyError.
var ErrNotAcquired = errors.New("lock: not acquired")

// ErrLockLost reports that a lease is no longer held by its owner: it
// expired, was taken over after expiry, or was released already.
var ErrLockLost = errors.New("lock: lock lost")

// ErrInvalidKey reports a key that is empty or longer than MaxKeyLen bytes.
var ErrInvalidKey = bounds.ErrInvalidKey

// ErrInvalidTTL reports a TTL shorter than MinTTL.
var ErrInvalidTTL = bounds.ErrInvalidTTL

// ErrInvalidOwner reports an owner identity longer than MaxOwnerLen.
var ErrInvalidOwner = bounds.ErrInvalidOwner

// ErrReentrancyUnsupported reports an acquisition with an owner (WithOwner)
// on a driver that does not implement owner reentrancy.
var ErrReentrancyUnsupported = errors.New("lock: owner reentrancy not supported by this driver")

// ErrClosed reports a call on a Locker (or an idempotency store) after
// its Close: every driver returns it for TryAcquire, Acquire and Begin, and
// to an Acquire that was waiting when Close was called.
var ErrClosed = errors.New("lock: locker closed")

// ErrStaleFence reports that a resource refused a write because a newer
// fence was already accepted. See FenceGate.
var ErrStaleFence = errors.New("lock: stale fence")

// BusyError is returned by TryAcquire when the key is busy: held by another
// lease.
// It matches ErrNotAcquired with errors.Is.
type BusyError struct {
	// Key is the key the caller asked for.
	Key string
	// TTL is the holder's remaining time to live as the store reported it,
	// or a negative value when the store could not tell.
	TTL time.Duration
}

func (e *BusyError) Error() string {
	if e.TTL < 0 {
		return fmt.Sprintf("lock: not acquired: %q is held", e.Key)
	}
	return fmt.Sprintf("lock: not acquired: %q is held for another %s", e.Key, e.TTL)
}

// Is reports whether target is ErrNotAcquired.
func (e *BusyError) Is(target error) bool { return target == ErrNotAcquired }

// StaleFenceError is returned by FenceGate.Admit for a fence lower than one
// already admitted. It matches ErrStaleFence with errors.Is.
type StaleFenceError struct {
	Resource string
	Fence    uint64 // the fence that was refused
	Current  uint64 // the highest fence admitted so far
}

func (e *StaleFenceError) Error() string {
	return fmt.Sprintf("lock: stale fence %d for %q: %d already admitted", e.Fence, e.Resource, e.Current)
}

// Is reports whether target is ErrStaleFence.
func (e *StaleFenceError) Is(target error) bool { return target == ErrStaleFence }
