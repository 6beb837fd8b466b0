package lock

import (
	"context"
	"fmt"
	"time"
)

// MaxKeyLen is the longest key, in bytes, that a Locker accepts.
const MaxKeyLen = 512

// MinTTL is the shortest TTL a Locker accepts. Shorter leases cannot be
// expressed by the stores (Redis PX and etcd leases count in milliseconds or
// more) and would expire before a single round trip completes.
const MinTTL = time.Millisecond

// Locker hands out leases on keys. Implementations are safe for concurrent
// use by many goroutines; each Locker stands for one client, and separate
// Lockers (in one process or many) exclude each other on the same store.
type Locker interface {
	// TryAcquire makes one attempt to take key for ttl. When the key is held
	// it returns an error matching ErrNotAcquired (a *HeldError carrying the
	// holder's remaining TTL) after a single round trip.
	TryAcquire(ctx context.Context, key string, ttl time.Duration) (Lease, error)

	// Acquire takes key for ttl, waiting while it is held until the holder
	// releases it, its TTL runs out, or ctx ends. When ctx ends first, the
	// error matches both ErrNotAcquired and ctx.Err(), and nothing is left
	// behind in the store.
	Acquire(ctx context.Context, key string, ttl time.Duration) (Lease, error)
}

// Lease is one acquisition of a key. It is valid until its TTL runs out
// unless refreshed; a lease is a promise with a deadline, not a mutex: a
// paused process can outlive its lease, which is what Fence is for.
type Lease interface {
	// Key is the key this lease holds.
	Key() string

	// Token is random per acquisition: only its holder can refresh or
	// release the lease.
	Token() string

	// Fence is strictly greater than the fence of every earlier lease on the
	// same key in the same store. Pass it to the resource the lock protects
	// so it can refuse writes from a holder whose lease has run out (see
	// FenceGate).
	Fence() uint64

	// Refresh extends the lease to ttl from now. It returns ErrLockLost when
	// the lease is no longer held by this token.
	Refresh(ctx context.Context, ttl time.Duration) error

	// Release gives the key up. It returns ErrLockLost when the lease was
	// no longer held by this token. It works even when ctx is already
	// cancelled (drivers then use a short internal deadline), and it is safe
	// to retry: a second Release after a successful one returns nil.
	Release(ctx context.Context) error

	// Done is closed when the lease is released or known to be lost: a
	// Refresh or Release found another token, or the lease's TTL ran out
	// without a successful Refresh.
	Done() <-chan struct{}
}

// ValidateKey returns an error matching ErrInvalidKey unless key is
// non-empty and at most MaxKeyLen bytes long.
func ValidateKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty", ErrInvalidKey)
	case len(key) > MaxKeyLen:
		return fmt.Errorf("%w: %d bytes, limit %d", ErrInvalidKey, len(key), MaxKeyLen)
	}
	return nil
}

// ValidateTTL returns an error matching ErrInvalidTTL when ttl is shorter
// than MinTTL.
func ValidateTTL(ttl time.Duration) error {
	if ttl < MinTTL {
		return fmt.Errorf("%w: %s, minimum %s", ErrInvalidTTL, ttl, MinTTL)
	}
	return nil
}

// Validate checks a key and a TTL together, the way every driver does
// before it talks to its store.
func Validate(key string, ttl time.Duration) error {
	if err := ValidateKey(key); err != nil {
		return err
	}
	return ValidateTTL(ttl)
}

// ReleaseTimeout is the deadline drivers give a Release whose caller's
// context is already cancelled, so that clean-up still happens.
const ReleaseTimeout = 5 * time.Second

// CleanupContext returns a context for clean-up work (Release, undoing a
// half-finished Acquire) that keeps ctx's values but not its cancellation,
// bounded by ReleaseTimeout.
func CleanupContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), ReleaseTimeout)
}
