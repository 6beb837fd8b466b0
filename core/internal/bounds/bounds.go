package bounds

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// MaxKeyLen is the longest key, in bytes (lock.MaxKeyLen).
const MaxKeyLen = 512

// MinTTL is the shortest TTL (lock.MinTTL).
const MinTTL = time.Millisecond

// MaxOwnerLen is the longest owner identity, in bytes (lock.MaxOwnerLen).
const MaxOwnerLen = 256

// Cleanup bounds clean-up that runs after its caller's context ended or
// has no deadline: a Release, giving back a claim, undoing a half-done
// acquisition (lockdriver.ReleaseTimeout).
const Cleanup = 5 * time.Second

// The errors of the checks (lock.ErrInvalidKey, lock.ErrInvalidTTL,
// lock.ErrInvalidOwner).
var (
	ErrInvalidKey   = errors.New("lock: invalid key")
	ErrInvalidTTL   = errors.New("lock: invalid ttl")
	ErrInvalidOwner = errors.New("lock: invalid owner")
)

// Key returns an error matching ErrInvalidKey unless key is 1 to
// MaxKeyLen bytes.
func Key(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty", ErrInvalidKey)
	case len(key) > MaxKeyLen:
		return fmt.Errorf("%w: %d bytes, limit %d", ErrInvalidKey, len(key), MaxKeyLen)
	}
	return nil
}

// TTL returns an error matching ErrInvalidTTL when ttl is shorter than
// MinTTL.
func TTL(ttl time.Duration) error {
	if ttl < MinTTL {
		return fmt.Errorf("%w: %s, minimum %s", ErrInvalidTTL, ttl, MinTTL)
	}
	return nil
}

// Owner returns an error matching ErrInvalidOwner for an owner longer
// than MaxOwnerLen bytes.
func Owner(owner string) error {
	if len(owner) > MaxOwnerLen {
		return fmt.Errorf("%w: %d bytes, limit %d", ErrInvalidOwner, len(owner), MaxOwnerLen)
	}
	return nil
}

// CleanupContext returns a context for clean-up work that keeps ctx's
// values but not its cancellation, ending Cleanup from now.
func CleanupContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), Cleanup)
}
