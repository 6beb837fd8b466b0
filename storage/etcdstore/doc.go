// Package etcdstore is the lock.Locker driver for etcd v3 (any 3.4 or later
// server, through go.etcd.io/etcd/client/v3).
//
//	client, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:2379"}})
//	store, err := etcdstore.New(client)
//	...
//	defer store.Close()
//	lease, err := store.Acquire(ctx, "order:42", 10*time.Second)
//
// # Data layout and round trips
//
// Every lock is a directory "<prefix><escaped key>/" (prefix default
// "oncekit/lock/"; the key is path-escaped so "a" and "a/b" never share
// one). Each acquisition writes an entry of its own, "<dir><session
// lease>-<token>", bound to the Store's session lease; no other
// acquisition ever reuses an entry, so a Release retried after a timeout
// can never delete a newer holder's entry. The holder is the entry with
// the lowest create revision; the lease's fence is that revision × 128
// (plus, for the leases a kept entry serves, one per lease before it; see
// Hot keys).
//
// TryAcquire is one transaction (take the key if the directory is empty,
// else read the holder's entry for its remaining TTL). Acquire is one
// transaction when uncontended (write the entry, read the first). Refresh
// is one transaction (compare the entry's create revision, record the new
// expiry); Release is one delete.
//
// # Hot keys
//
// A key this Store asks for again within 10 ms of releasing it is hot here
// (a loop, a stream of orders for one item), unless a kept entry of it went
// unused in the last 100 ms (two processes taking turns): its Release keeps the entry
// for WithLinger (default 100 µs), and the Store's next Acquire of the key
// in that moment takes it with no request — the same entry, its validity
// (at least 7/8 of the asked TTL must be left) and the next fence
// (revision × 128 + 1, + 2, …: every later entry's revision is higher, so
// its fences are above them). Within WithMaxLocalHandOffs leases in a row
// (default 16) or as many as start within WithMaxLocalHold of taking the
// key (default 1 ms), whichever is more, the entry is then deleted so that
// the next waiting process gets its turn. A lease that passed its entry on
// never refreshes or deletes it again. The price: the key stays held for
// up to the linger after Release returns, and a process that exits in that
// moment without Close leaves it held until its session's TTL ends.
//
// # Waiting
//
// A waiter waits for the entry just before its own (its predecessor) to be
// deleted, so a release wakes exactly one waiter, in arrival order. The
// deletes reach it through one long-lived watch on the directory per Store
// and key, kept open while waiters use it and for two seconds after: a watch
// created at a past revision — which under contention even "now" quickly
// becomes — is served by etcd's 100 ms catch-up loop, the reason
// concurrency.Mutex needs about 100 ms per hand-off (see BENCHMARKS.md).
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
//
// # Owners
//
// With lock.WithOwner, a record "<prefix><escaped key>\x00owner" (outside
// every queue directory) names the owner, the holder's entry and the number
// of holds. Re-entering and giving a hold back are transactions conditional
// on the record's mod revision and the entry's create revision; a hold
// whose TTL runs out gives back only itself.
//
// # Idempotency records
//
// Store is also an idem.Store. Each claim of a key is an entry of its own
// under "oncekit/idem/<escaped key>/" (WithRecordPrefix), so a claim taken
// over after its lease is a new key with a new create revision, which is
// also its fence. An in-flight claim is bound to the session of its lease's
// TTL class and ended by the claiming Store when its lease runs out without
// an Extend: no client takes a claim over by comparing its clock with the
// claimer's. Values carry a version byte and an expiry (a hint for other
// clients); completed records are bound to a lease shared by the records
// that expire in the same minute. "oncekit/idem/<escaped key>#attempts"
// counts the key's claims (its version) for idem.Claim.Attempt: every
// claim puts it in the claim's transaction, a completion deletes it, and a
// lease (one per hour of claims) ends it between idem.AttemptMemory and an
// hour more after the last claim. A claim's effect (Effect) joins the
// transaction that completes its record.
package etcdstore
