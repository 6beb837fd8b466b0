// Package etcdstore is the lock.Locker driver for etcd v3 (any 3.4 or later
// server, through go.etcd.io/etcd/client/v3).
//
//	client, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:2379"}})
//	store, err := etcdstore.New(client)
//	...
//	defer store.Close()
//	lease, err := store.Acquire(ctx, "order:42", 10*time.Second)
//
// How it works inside — data layout and round trips, hot keys, waiting,
// owners, idempotency records — is in docs/drivers.md, "How etcdstore
// works"
// (https://github.com/oncekit/oncekit/blob/main/docs/drivers.md#how-etcdstore-works).
//
// # TTLs and sessions
//
// Keys are bound to session leases, one per TTL class: a lease's TTL
// rounded up to whole seconds (etcd raises very short ones to its own
// minimum, about 2 s with default settings). The Store keeps each session
// alive in the background with keep-alives every third of its TTL, and
// counts its validity from when each keep-alive was sent, never from when
// the answer arrived: a Store cut off from the servers ends the session —
// and every lease on it (Done closes) — before the server can free its
// keys for anyone else. Close revokes the sessions.
//
// A lease's own TTL is enforced by the Store: without a Refresh it ends when
// its TTL runs out (Done closes) and its entry is deleted, retried until the
// servers answer. When the process dies or is paused, its entries go within
// the session's TTL (the TTL rounded up as above) of its last heartbeat:
// every session writes a heartbeat key, "<prefix>\x00session/<lease>",
// after each keep-alive, and counts its validity only from keep-alives
// whose heartbeat was stored. A waiter that has seen no new heartbeat from
// its predecessor's session for that TTL (plus 2 % and 10 ms for clock
// rates) deletes the predecessor's entry, in a transaction conditional on
// the heartbeat being unchanged. Left to etcd, the key would go when the
// leader's lessor, which looks every 500 ms, revokes the lease: up to half
// a second later. Only elapsed times on each side are compared, never two
// clocks. Done also closes
// when the session is lost and — once Done has been called — when the entry
// is deleted by anyone else. If the session is lost while Acquire waits,
// Acquire starts over in a new session. A Release cut by a leader election
// is retried within its context (5 s without a deadline); one that still
// fails leaves a background delete running, so a released entry never
// blocks the queue until its lease runs out.
//
// A waiter that gives up (its ctx ends) deletes its entry, retrying in the
// background until it succeeds: an entry left in the queue would block
// everyone behind it.
//
// # Limits
//
// Every acquisition and release is a raft write (a disk sync on the
// leader), so a key changes hands at most a few hundred to a thousand times
// a second. Each session also writes its heartbeat every third of its TTL,
// and a Store with waiters keeps one watch on the heartbeats. The recorded expiry that other clients' TryAcquire reports for
// a holder that waited in the queue counts from when it joined the queue,
// until its first Refresh.
package etcdstore
