package lockdriver

import (
	"context"
	"time"

	"github.com/oncekit/oncekit/core/lock"
)

// LockInfo is what a store knows of one key, for operators: who holds it,
// with which fence, for how long yet, and how many wait.
type LockInfo struct {
	Key  string
	Held bool
	// Token is the first 8 characters of the holder's token:
	// enough to match it against logs, not to act as the holder.
	Token string
	// Owner is the reentrant owner holding the key (WithOwner), and Holds
	// how many holds it has; "" and 1 (or 0 when free) otherwise.
	Owner string
	Holds int
	// Fence is the holder's fence, or when the key is free the last one the
	// store issued for it (0 when it never issued one or does not keep it).
	// Redis reserves a range of fences for each take (the leases its
	// process hands the key to without a round trip take the next ones)
	// and reports the last of the range: at least the holder's. Redlock
	// keeps a fence per node and reports the highest among the nodes
	// holding the key: at least the holder's, and above it when a node
	// answered after the holder had its majority.
	Fence uint64
	// TTL is the holder's remaining time; -1 for a key without expiry.
	TTL time.Duration
	// Waiters is how many are queued for the key in the store: processes
	// for Redis and Redlock, acquisitions for etcd, goroutines for memory.
	// -1 when the store cannot tell.
	Waiters int
	// Detail is driver-specific, free-form: for Redlock, how many nodes
	// agree.
	Detail string
}

// Inspector is implemented by every oncekit driver: it answers who holds a
// key and lets an operator free a key whose holder is stuck.
type Inspector interface {
	// InspectLock reports key's state; a free key is not an error.
	InspectLock(ctx context.Context, key string) (LockInfo, error)
	// ForceRelease frees key whoever holds it, and wakes its waiters. It
	// returns the state it found; Held false means there was nothing to
	// free. The holder learns of it at its next refresh (lock.ErrLockLost), so
	// until then two parties may act: fencing is what keeps the resource
	// safe. It is a tool for an operator, not for programs.
	ForceRelease(ctx context.Context, key string) (LockInfo, error)
}

// MultiLocker is implemented by drivers that can take several keys at once
// more cheaply than one by one (a single script for keys in one Redis hash
// slot). lock.AcquireAll uses it when the Locker offers it: keys arrive
// validated, de-duplicated and in canonical order, and the driver returns
// one lease per key in that order, or an error matching
// errors.ErrUnsupported when it cannot take this set at once (keys in
// different slots), and AcquireAll then takes them one by one.
type MultiLocker interface {
	AcquireAll(ctx context.Context, keys []string, ttl time.Duration) ([]lock.Lease, error)
}
