package lock

import (
	"context"

	"github.com/oncekit/oncekit/core/internal/bounds"
)

// MaxOwnerLen is the longest owner identity, in bytes.
const MaxOwnerLen = bounds.MaxOwnerLen

type ownerKey struct{}

// WithOwner returns a context whose acquisitions belong to owner: the same
// owner acquiring a key it already holds gets the same lease again (same
// token and fence) with a hold count incremented, instead of waiting on
// itself; each Release of a returned lease gives one hold back, and the key
// is freed when the last is released. Without an owner (the default) a
// second Acquire of a held key waits, whoever asks.
//
// Reentrancy is off by default because it turns "one at a time" into "one
// owner at a time": anything sharing the owner identity passes straight
// through. An owner must identify one logical holder — a job, a worker, a
// saga instance — and must never be derived from a request or message ID:
// those are lock keys, and a retried request carrying the same ID would
// re-enter the lock its first attempt still holds and run twice.
//
// An empty owner means none.
func WithOwner(ctx context.Context, owner string) context.Context {
	return context.WithValue(ctx, ownerKey{}, owner)
}

// Owner returns the owner identity set by WithOwner, or "".
func Owner(ctx context.Context) string {
	o, _ := ctx.Value(ownerKey{}).(string)
	return o
}
