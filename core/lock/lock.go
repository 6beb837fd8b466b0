package lock

import (
	"context"
	"time"

	"github.com/oncekit/oncekit/core/internal/bounds"
)

// MaxKeyLen is the longest key, in bytes, that a Locker accepts.
const MaxKeyLen = bounds.MaxKeyLen

// MinTTL is the shortest TTL a Locker accepts. Shorter leases cannot be
// expressed by the stores (Redis PX and etcd leases count in milliseconds or
// more) and would expire before a single round trip completes.
const MinTTL = bounds.MinTTL

// Locker hands out leases on keys. Implementations are safe for concurrent
// use by many goroutines; each Locker stands for one client, and separate
// Lockers (in one process or many) exclude each other on the same store.
type Locker interface {
	// TryAcquire makes one attempt to take key for ttl. When the key is held
	// it returns an error matching ErrNotAcquired (a *BusyError carrying the
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

	// Token is random per hold of the key in the store: only its holder
	// can refresh or release the lease. Leases that continue one hold share
	// its token: an owner's re-entries (WithOwner), and the leases a Redis
	// driver hands from one to the next inside its process without a round
	// trip (local hand-offs); each of those has a fence of its own.
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
	// cancelled, and a ctx without a deadline is bounded too (drivers then
	// use a short internal deadline, 5 s); it is safe to retry: a second
	// Release after a successful one returns nil.
	Release(ctx context.Context) error

	// Done is closed when the lease is released or known to be lost: a
	// Refresh or Release found another token, or the lease's TTL ran out
	// without a successful Refresh.
	Done() <-chan struct{}

	// Deadline is when the lease's validity ends as this process knows it:
	// the start of the last successful acquisition or Refresh plus its TTL
	// (minus the drift allowance on Redlock). Done closes then unless a
	// Refresh moves it. Past it, the key may be someone else's. The zero
	// time once the lease has ended.
	Deadline() time.Time
}

// checkKey and checkTTL are the bounds above (package bounds owns them;
// drivers check them with package lockdriver, through the same code).
func checkKey(key string) error { return bounds.Key(key) }

func checkTTL(ttl time.Duration) error { return bounds.TTL(ttl) }

// cleanupTimeout bounds clean-up that runs after the caller's context
// ended (releasing the keys a failed AcquireAll took).
const cleanupTimeout = bounds.Cleanup
