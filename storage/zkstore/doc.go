// Package zkstore is the lock.Locker and idemdriver.Store driver for Apache
// ZooKeeper (3.5 or later; tested on 3.8), through
// github.com/go-zookeeper/zk.
//
//	store, err := zkstore.Connect(ctx, []string{"zk1:2181", "zk2:2181", "zk3:2181"},
//		zkstore.WithSessionTimeout(10*time.Second))
//	...
//	defer store.Close()
//	lease, err := store.Acquire(ctx, "order:42", 30*time.Second)
//
// storage.Open takes the same ensemble as "zk://zk1:2181,zk2:2181/oncekit".
//
// How it works inside — locks: the recipe of the zookeeper documentation,
// owners, idempotency records — is in docs/drivers.md, "How zkstore works"
// (https://github.com/oncekit/oncekit/blob/main/docs/drivers.md#how-zkstore-works).
//
// # TTLs and sessions
//
// A ZooKeeper session's timeout is negotiated with the servers (2 to 20
// of their ticks) and is not a lease's TTL. On this driver:
//
//   - The TTL bounds the lease: without a Refresh, its Done closes when the
//     TTL runs out, and the Store deletes its node, which frees the key.
//     A Refresh records the new TTL on the node (for TryAcquire and
//     InspectLock to report) and checks the node is still there.
//   - The session bounds the key of a holder that cannot act: a process
//     that crashed, froze (SIGSTOP) or was cut off from the ensemble keeps
//     its key until the servers expire its session, one session timeout
//     after they last heard from it — not its TTL. Pick the session
//     timeout as the time a dead holder may block a key.
//   - A lease is never reported held once another client may hold its key:
//     every lease of the Store ends (Done closes) the moment the client
//     loses its connection to the ensemble, as Curator's standard policy
//     treats SUSPENDED as lost. The client notices within two thirds of the
//     session timeout (its read timeout), before the servers can expire the
//     session — unless a send blocked in a large write holds its pings
//     back, which delays that to about 4/3 of the timeout. So the Store
//     keeps its own liveness clock: while it holds leases it asks the
//     ensemble something every sixth of the session timeout, and when
//     nothing was answered for two thirds of it, every lease ends.
//   - A waiter's lease counts from when the key became its own, not from
//     when it began waiting. If the session survives the disconnection, the Store
//     deletes the ended leases' nodes as soon as it is back; if it expired,
//     the servers did. Refresh and Release of such a lease report
//     lock.ErrLockLost.
//
// A waiter (Acquire) whose context ends deletes its node before it
// returns — also when its context ended while the request that creates the
// node was on the wire: it waits for that answer, within the clean-up bound
// (lockdriver.ReleaseTimeout), so that once it has returned its key is free
// of it. A Begin whose context ends that way gives its claim back the same
// way. A node whose
// creation's answer was lost with the connection is found again by the
// token in its name and deleted (Curator's protected mode). Deletions the
// ensemble cannot take now are retried until it confirms them or the
// session ends: a node left behind would block its key for as long as the
// session lives. A request the ensemble does not answer within twice the
// session timeout fails with ErrRequestTimeout.
//
// # Limits
//
// The Store keeps no local queue and no hold between acquisitions: every
// acquisition is its own node and every hand-off a delete and a listing,
// including between goroutines of one process. ACLs are open
// (world:anyone); put the root under a chroot or an ACL of your own
// through Conn if the ensemble is shared.
package zkstore
