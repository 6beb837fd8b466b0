package bounds

import (
	"context"
	"errors"
	"fmt"
	"strings"
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

// MaxPlaceLen is the longest place of a placed key (idemdriver.MaxPlaceLen).
const MaxPlaceLen = 64

// Place checks a non-empty place: at most MaxPlaceLen bytes, no brace.
func Place(place string) error {
	switch {
	case len(place) > MaxPlaceLen:
		return fmt.Errorf("idem: place %.16q... is longer than %d bytes", place, MaxPlaceLen)
	case strings.ContainsAny(place, "{}"):
		return fmt.Errorf("idem: place %q holds a brace", place)
	}
	return nil
}

// PlaceOf returns the place of a placed key ("{place}rest"), and false for
// a key that is not placed: one that does not start with '{', one whose
// first '}' comes right after it or more than MaxPlaceLen bytes later.
func PlaceOf(key string) (place string, ok bool) {
	if !strings.HasPrefix(key, "{") {
		return "", false
	}
	end := strings.IndexByte(key, '}')
	if end < 2 || end > MaxPlaceLen+1 {
		return "", false
	}
	return key[1:end], true
}
