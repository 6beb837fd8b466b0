package lockdriver

import (
	"context"
	"errors"
	"time"

	"github.com/oncekit/oncekit/core/internal/bounds"
	"github.com/oncekit/oncekit/core/internal/ctxbound"
	"github.com/oncekit/oncekit/core/lock"
)

// ValidateKey returns an error matching lock.ErrInvalidKey unless key is
// non-empty and at most lock.MaxKeyLen bytes long.
func ValidateKey(key string) error { return bounds.Key(key) }

// ValidateTTL returns an error matching lock.ErrInvalidTTL when ttl is
// shorter than lock.MinTTL.
func ValidateTTL(ttl time.Duration) error { return bounds.TTL(ttl) }

// ValidateOwner returns an error matching lock.ErrInvalidOwner for an owner
// longer than lock.MaxOwnerLen bytes.
func ValidateOwner(owner string) error { return bounds.Owner(owner) }

// Validate checks a key and a TTL together, the way every driver does
// before it talks to its store.
func Validate(key string, ttl time.Duration) error {
	if err := ValidateKey(key); err != nil {
		return err
	}
	return ValidateTTL(ttl)
}

// CheckAcquire is the check every Acquire and TryAcquire starts with: the
// key, the TTL, the owner of ctx (lock.WithOwner), and ctx itself, whose
// end is reported as lock.ErrNotAcquired joined with ctx.Err(). It returns
// the owner.
func CheckAcquire(ctx context.Context, key string, ttl time.Duration) (owner string, err error) {
	if err := Validate(key, ttl); err != nil {
		return "", err
	}
	owner = lock.Owner(ctx)
	if err := ValidateOwner(owner); err != nil {
		return "", err
	}
	if err := ctx.Err(); err != nil {
		return "", NotAcquired(ctx)
	}
	return owner, nil
}

// NotAcquired is the error of an acquisition that ctx ended: it matches
// lock.ErrNotAcquired and ctx.Err(), and each of causes.
func NotAcquired(ctx context.Context, causes ...error) error {
	return errors.Join(append([]error{lock.ErrNotAcquired, ctx.Err()}, causes...)...)
}

// ReleaseTimeout is the deadline a Release whose caller's context is
// already cancelled gets, so that clean-up still happens.
const ReleaseTimeout = bounds.Cleanup

// CleanupContext returns a context for clean-up work (Release, undoing a
// half-finished Acquire) that keeps ctx's values but not its cancellation,
// bounded by ReleaseTimeout (a BoundedContext).
func CleanupContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return ctxbound.Cleanup(ctx)
}

// BoundedContext returns a context that keeps ctx's values but not its
// cancellation and ends at deadline — and at no other time before its
// cancel function is called, which its maker does only once the work it
// bounds is over. DeadlineOnly recognises it (and the contexts that only
// add values to it), so that a driver whose client enforces context
// deadlines on its own (go-redis with ContextTimeoutEnabled) can run a
// request under it on the caller's goroutine, instead of on a background
// one that lets the caller return the moment the context is cancelled.
func BoundedContext(ctx context.Context, deadline time.Time) (context.Context, context.CancelFunc) {
	return ctxbound.Bounded(ctx, deadline)
}

// ReleaseContext returns the context a Release under ctx runs in, and the
// function to call when it is over: ctx itself when it has a deadline;
// CleanupContext when it has ended already; ctx within ReleaseTimeout when
// it has no deadline. context.Background and context.TODO, the usual
// context of a deferred Release, share one BoundedContext for a tenth of
// a second (a timer and a context per Release are the larger part of what
// the call costs beyond the request).
func ReleaseContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return ctxbound.Release(ctx)
}

// DeadlineOnly reports whether ctx can end only at its deadline: it never
// ends (no Done channel), or it is a BoundedContext or only adds values to
// one. A context derived from one with a cancel of its own is not.
func DeadlineOnly(ctx context.Context) bool { return ctxbound.DeadlineOnly(ctx) }

// TokenPrefixLen is how much of a holder's token is shown to operators
// (LockInfo.Token, idemdriver.RecordInfo.Token).
const TokenPrefixLen = 8

// TokenPrefix shortens a token for display.
func TokenPrefix(tok string) string {
	if len(tok) > TokenPrefixLen {
		return tok[:TokenPrefixLen]
	}
	return tok
}
