// Package redisstore is the lock.Locker driver for one Redis deployment: a
// single server, a Sentinel-managed primary, or a Cluster, through any
// go-redis v9 UniversalClient.
//
//	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
//	store, err := redisstore.New(client)
//	...
//	defer store.Close()
//	lease, err := store.Acquire(ctx, "order:42", 10*time.Second)
//
// How it works inside — data layout, round trips, waiting, local hand-offs
// and hot keys, cancellation and faults, several keys, owners, idempotency
// records — is in docs/drivers.md, "How redisstore works"
// (https://github.com/oncekit/oncekit/blob/main/docs/drivers.md#how-redisstore-works).
//
// # Contexts
//
// Every call returns when its context ends, even while the server is
// paused: a request under a context the caller can cancel runs on a pooled
// background goroutine, left to finish (and undone if it took something)
// when the caller leaves. Requests under contexts that only a deadline can
// end (Release's clean-up context, an idempotency Guard's completion) run
// on the caller's goroutine when the client enforces deadlines itself —
// ContextTimeoutEnabled: true, recommended — which saves the hop. So do
// the claims of httpmw and grpcmw requests (idemdriver.ClaimOutlivesCaller): a
// request's claim is not cut short by a client that hangs up.
//
// # Replicas and failover
//
// A Redis primary acknowledges a write before its replicas have it: if it
// dies then and Sentinel (or a Cluster) promotes a replica, a lock or a
// claim that was just granted is gone, and another client takes it —
// two holders, two runs (TestFailover shows it on real processes).
// WithReplicas(n, timeout) closes that window: every write that grants,
// refreshes or completes a lease or a claim is followed, in the same round
// trip, by WAIT n timeout, and a lease or claim that fewer than n replicas
// acknowledged is given back and the call fails with ErrNotReplicated.
// A hand-off between goroutines of the Store in one round trip waits the
// same way (TestFailoverHandOff), and so does a replay: Begin returns a
// completed record only once the replicas have it, so a completion whose
// WAIT failed is neither reported stored by the Guard nor replayed to a
// duplicate until they do (TestFailoverCompletionAcknowledged).
// Fences are written by the same scripts. WAIT is not fsync (WAITAOF
// needs Redis 7.2): a write acknowledged by replicas that are all lost
// with the primary can still be lost. Releases do not wait: a release lost
// in a failover keeps its key held until its TTL, never gives it twice.
// Under Cluster the WAIT goes to the primary of the key's slot (found again
// after a failover), and a shard left without replicas refuses grants
// until one is back (TestClusterFailover). storage.Open takes it as
// replicas=N (replica_timeout=1s).
//
// # Limits
//
// Without WithReplicas, a failover can lose a lock that was just taken
// (above); redlockstore (N independent servers) and etcdstore do not have
// that window. Under Redis Cluster, one Store's pub/sub connection serves the keys of
// one shard; waiters on keys of other shards fall back to the holder's TTL
// and the recheck interval.
package redisstore
