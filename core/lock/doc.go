// Package lock is oncekit's distributed lock core: the Locker and Lease
// contracts every driver implements, the errors they return, Mutex (a
// Locker with a default TTL, a watchdog and Do), and FenceGate, the
// resource-side half of fencing.
//
// # Leases, not mutexes
//
// A Lease holds its key until it is released or its TTL runs out. The TTL
// is what frees the key when a holder crashes; it also means a holder that
// stalls (a GC pause, a stopped VM, a partition) can lose the key without
// noticing at once. Two tools close that gap:
//
//   - Lease.Done is closed as soon as the lease is known to be lost, and
//     Mutex.Do cancels the function's context at that moment;
//   - Lease.Fence is strictly greater than every earlier lease's on the
//     same key, so the protected resource can refuse a late write from an
//     old holder (FenceGate, or a "WHERE fence <= $new" clause in SQL).
//
// Fences are per key: a lock's fence orders the holders of that key, and
// fences of different keys are not comparable. They never go backwards,
// not even when a store loses its counters (a Redis restart without
// persistence, a lossy failover, an expired counter): Redis counters are
// raised to at least the server's clock in microseconds, etcd fences are
// revisions, SQL fences are at least the database server's clock in
// microseconds, ZooKeeper fences are zxids, memstore starts from the
// clock. Fencing only writes does not
// protect a read-modify-write whose read came before a pause: fence the
// read too, or make the write a compare-and-set on what was read.
//
// # Bounds
//
// Keys are 1 to MaxKeyLen (512) bytes; anything else is ErrInvalidKey.
// TTLs are at least MinTTL (1 ms); anything shorter is ErrInvalidTTL.
// Drivers check both before they talk to their store.
//
// # Errors
//
// A held key gives ErrNotAcquired (a *BusyError with the holder's remaining
// TTL from TryAcquire); a cancelled wait gives an error matching both
// ErrNotAcquired and ctx.Err(); a lease that is no longer its holder's gives
// ErrLockLost from Refresh and Release. Test with errors.Is.
//
// # Drivers
//
// storage/memstore (in-process), storage/redisstore (one Redis, Sentinel or
// Cluster), storage/redlockstore (N independent Redis servers, majority
// quorum), storage/etcdstore (etcd v3), storage/sqlstore (PostgreSQL,
// MySQL 8 or MariaDB) and storage/zkstore (ZooKeeper). Every driver passes
// the conformance suite in core/lock/locktest.
//
// # Owners
//
// WithOwner makes acquisitions reentrant for one owner identity: the owner
// acquiring a key it already holds gets the same token and fence with one
// more hold, and the key is freed with the last Release. Without an owner
// (the default) a second Acquire of a held key waits, whoever asks. Drivers
// that do not implement it return ErrReentrancyUnsupported.
//
// # Several keys
//
// AcquireAll takes several keys all or nothing, in one canonical order so
// that callers asking for overlapping sets cannot deadlock, and returns a
// MultiLease that refreshes and releases them together.
package lock
