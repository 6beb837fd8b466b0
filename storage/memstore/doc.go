// Package memstore is oncekit's in-process driver: locks that exclude the
// goroutines of one process, with the same promises as the networked
// drivers (TTLs, fencing, tokens, prompt hand-off) and none of their round
// trips.
//
// It is the embedded default for single-process services, demos and tests
// of code that uses oncekit, and the reference semantics the other drivers
// are checked against. It does not coordinate separate processes: for that,
// use redisstore, redlockstore, etcdstore, sqlstore or zkstore.
//
// Waiters are served in FIFO order: a release hands the key directly to the
// longest-waiting Acquire. Fences come from one counter shared by all keys
// of a Store, so they are strictly increasing per key as the Locker contract
// requires (and also across keys, which callers must not rely on). State for
// a key is dropped as soon as it is neither held nor awaited.
//
// With lock.WithOwner, the owner of a held key re-enters it at once: the
// same token and fence, one more hold; the key is freed with the last
// Release, and a hold's Done closes when it is released or the key is lost.
//
// Store is also an idemdriver.Store (records beside the locks, expiry checked on
// every read, expired records swept as others are read) and an idemdriver.Waiter.
package memstore
