// Package zkstore is the lock.Locker and idem.Store driver for Apache
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
// # Locks: the recipe of the ZooKeeper documentation
//
// Every key is a container node, "<root>/lock/<escaped key>" (root default
// "/oncekit"; the key is escaped so that any bytes make one znode name).
// Each acquisition creates an ephemeral sequential node under it,
// "<token>-<sequence>", bound to the Store's session. The node with the
// lowest sequence holds the key; every other waits for the node just
// before its own to be deleted (a watch on that one node), so a release
// wakes exactly one waiter, in arrival order — no herd. The lease's fence
// is the zxid of the transaction that created its node (the node is
// created in a multi-operation transaction with a write to the key's
// directory, whose answer carries the zxid): ZooKeeper issues zxids in one
// order for the whole ensemble, across leader elections, so a later
// acquisition's fence is higher even after the key's directory was
// deleted and made again.
//
// Acquire is two requests when the key is free (the create, a listing);
// TryAcquire on a held key is a listing, a sync with the leader and the
// listing again (a session reads from its own server, which may not have
// applied a release another server has confirmed; the sync makes a key
// released before the call began read as free), plus one to read the
// holder's remaining TTL; Release is one delete. Every write is a quorum
// write with a disk sync on the members, about a millisecond on a quiet
// machine: a key changes hands a few hundred times a second, about as fast
// as go-zookeeper's own zk.Lock (see BENCHMARKS.md).
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
// # Owners
//
// With lock.WithOwner, the holder's node records its owner. An acquisition
// by the same owner — in this process or another — creates a re-entry node
// "~r-<sequence>-<id>" beside it, anchored at the holder's sequence
// number, and gets the holder's token and fence. The key stays held while
// the holder's node or any of its re-entry nodes lasts: a waiter first in
// the queue also waits for re-entry nodes anchored at an earlier holder.
// Each hold is its own node with its own TTL; a hold that runs out gives
// back only itself.
//
// # Idempotency records
//
// Store is also an idem.Store, an idem.EffectStore and an idem.Waiter.
// A record is one persistent node, "<root>/idem/<bucket>/<escaped key>"
// (256 buckets, so that no directory outgrows a ZooKeeper packet), holding
// its state, token, fingerprint, fence, lease or retention, attempt, and
// result. An abandoned claim's record stays, marked abandoned, and a claim
// whose lease ran out stays as it was, for idem.AttemptMemory: the next
// claim's attempt is one more than theirs.
// Every write is a compare-and-set on the node's version. Expiry is judged
// by the servers' clock: the node's modification time plus the lease or
// retention, compared with the modification time of a write to
// "<root>/clock" when this process's clock says the record may have
// expired — both stamped by the same leader: a record last written under
// a leader an election replaced is written again instead (its time
// restarts under the current leader, a lease or retention later at most),
// since two machines' clocks are never compared. A claim's fence is the zxid of the write that claimed it. A
// record whose retention ended is replaced by the next Begin of its key;
// Cleanup (or WithCleanup) deletes expired records (claims that ended
// without completing once idem.AttemptMemory has passed) in the background — TTL
// nodes are not used, because a record's time to live changes when it
// completes and a TTL node's cannot. A completion's Effect (znode writes
// with versions as conditions) joins the multi-operation transaction that
// completes the record. Results are limited to MaxResultBytes (ZooKeeper's
// request limit, jute.maxbuffer, is 1 MiB by default), and a completion
// whose effect would make the request larger fails as an
// *idem.EffectFailedError before it is sent (sent, it would drop the
// session's connection, and every retry again).
//
// # Limits
//
// The Store keeps no local queue and no hold between acquisitions: every
// acquisition is its own node and every hand-off a delete and a listing,
// including between goroutines of one process. ACLs are open
// (world:anyone); put the root under a chroot or an ACL of your own
// through Conn if the ensemble is shared.
package zkstore
