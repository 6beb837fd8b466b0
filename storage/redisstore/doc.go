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
// # Data layout
//
// A key K lives in one Redis string, "<prefix>{K}" (the prefix defaults to
// "oncekit:lock:"; the hash tag keeps every name of a key in one Cluster
// slot): "L1|<token>|<fence>|<flags>" with a PX expiry while held. Its fence
// is issued when the key is taken: max(the key's last fence + 1, the
// server's clock in µs). A release deletes the key once the server's clock
// has passed its fence — any later take issues at least the clock, which is
// then above it — and otherwise (a fence issued faster than the clock
// moves, or carried over from a server whose clock ran ahead) leaves a
// tombstone "L1|~|<fence>|<flags>" that expires when the clock passes the
// fence (a minute, while flags must be kept). Fences therefore rise with
// every take, also after the key expired, after a tombstone lived out its
// life, and after a restart without persistence, as long as the server's
// clock does not step back. Nothing is kept for a key nobody holds: no
// second key per lock, no memory that grows with the number of keys ever
// locked. The flags mark what is rare: "o" an owner's holds are recorded
// beside the key (see Owners), "w" processes wait in its queue (see
// Waiting); a release looks at the queue and announces itself only then.
// "<prefix>{K}:release" is the channel a release is announced on.
//
// # Round trips
//
// Every operation is one Lua script, embedded in the binary and sent as
// EVALSHA; each starts with a fast path that decides the common case with
// the fewest calls: TryAcquire and an uncontended Acquire of a free key
// (TIME, SET NX GET PX), Refresh (compare token, PEXPIRE), and Release of
// a key nobody waits for (GET, DEL; TIME too when the fence may be ahead
// of the server's clock). A first attempt at a key and the release of a
// key taken that way are sent as short scripts, with the lock key (and
// its queue's two keys) and a few arguments; a key with flags is left to
// the full script, a second round trip. Redis 6.2 is the oldest server
// supported; before 7.0 (no SET NX GET) every first attempt takes that
// second round trip.
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
// the claims of httpmw and grpcmw requests (idem.ClaimOutlivesCaller): a
// request's claim is not cut short by a client that hangs up.
//
// # Waiting
//
// Goroutines of one Store waiting for one key queue up in the Store, first
// come first served; only the first competes in Redis. Processes waiting
// for a key queue up in Redis too: a sorted set "<prefix>{K}:q" (with the
// members' expiries in "<prefix>{K}:qx") records, in arrival order, the
// Stores whose competitor found the key held, and the release script
// announces the release on the first live member's own channel
// ("<prefix>{K}:release:<store id>"), so a release wakes one process, not
// all of them. Usually it does more: a waiting member records its token and
// TTL with its place, and the release grants it the key — sets the key to
// that token with a new fence and announces "g|<token>|<fence>" — so the
// waiter holds the key the moment the message arrives, without another
// round trip; its lease's validity counts from its last attempt, which
// found the key held and so came before the grant. A grant is used only
// when its fence is above the highest fence the waiter's busy attempts
// saw (the acquire script reports it): a grant read late, after an attempt
// that found another holder, is older than that attempt and is dropped,
// so a stalled waiter never holds the key beside the one who took it
// after the grant expired. A member is granted the
// key only if the announcement reaches someone (a dead process's
// subscription went with its connections; it is dropped instead). A waiter
// that gives up gives back a grant to its token, one already made or one
// still on its way. A process keeps a channel subscribed for a second after
// its last waiter on it left, so that waiting for the same key again costs
// no new subscription; a grant that reaches it meanwhile is given back the
// same way. An owner's waiter (lock.WithOwner) is woken instead,
// and tries: the key then stays reserved for that member until it tries
// again or a grace of 4 × the max backoff runs out: any other caller finds
// it busy meanwhile, so a process that releases and at once asks again
// cannot take it back from the woken waiter (bounded barging; without it,
// one process could keep a contended key for seconds). A member that
// stops trying (a dead process) expires after three recheck intervals.
// When nobody is queued, and on servers before Redis 7 (whose scripts
// cannot tell their version), the release goes to
// the general channel "<prefix>{K}:release". Waiters listen on both over
// the Store's single pub/sub connection (shared by all keys) and try again
// when a release message arrives, when the holder's remaining TTL runs
// out, or at the latest after WithRecheckInterval (default 1 s), in case a
// message was lost while the pub/sub connection reconnected.
//
// # Local hand-offs and hot keys
//
// When a lease of the Store is released while another goroutine of the
// same Store waits, the key is handed to it without being let go, and
// usually without a round trip: the next lease continues the Store's hold
// (same token in Redis, same expiry) with the hold's next fence. Each take
// in Redis reserves the fences the hold's leases take: from
// max(last + 1, the server's clock in µs), up to 128 of them but never
// more than 127 µs past the clock (a key taken faster gets fewer), and the
// key keeps the last; every later take issues above it, so fences rise
// with every lease, stay near the clock in µs (below 2^53, lock.MaxFence:
// a Lua fence check compares them exactly) and cannot outrun the clock,
// their floor after a loss. Every Store reserves alike, whatever its
// options. A hold with less than 7/8 of the next lease's TTL left, or with
// its fences spent, is handed on in one round trip instead (new token, new
// fences, new expiry).
//
// A key this Store asks for again within 10 ms of letting it go is hot
// here (a loop, a stream of orders for one item), unless a kept hold of it
// went unused in the last 100 ms (two processes taking turns): its Release keeps the
// hold for WithLinger (default 100 µs), and the Store's next Acquire of the
// key in that moment takes it the same way, with no round trip. A process
// that takes one key over and over thus runs at memory speed.
//
// Either way the Store lets the key go, granting it to the first waiting
// process, after WithMaxLocalHandOffs hand-offs in a row (default 16) or
// as many as start within WithMaxLocalHold of taking the key (default 1
// ms), whichever is more: bounded barging, so waiting processes get their
// turn. The price of keeping hot keys: the key stays held for up to the
// linger after Release returns, so another process's TryAcquire
// may find it busy then, and a process that exits in that moment without
// Close leaves it held until its TTL ends. Close lets kept keys go.
//
// # Cancellation and faults
//
// A cancelled Acquire leaves nothing behind: after an uncertain failure it
// deletes what its last attempt may have taken, and the acquire script
// refuses to take a key when the request reaches the server after the
// caller's deadline (by the server's clock), which covers a paused server.
// A lease whose refreshes fail closes Done when its TTL, counted from
// before the request that set it, runs out.
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
//
// # Several keys
//
// Store implements lock.MultiLocker: outside Cluster, lock.AcquireAll takes
// all its keys in one script (all or nothing, one round trip) and, while
// one of them is held, waits for that key's release; under Cluster it takes
// them one by one in canonical order.
//
// # Owners
//
// With lock.WithOwner, a fourth name "<prefix>{K}:owner" (same hash tag, same
// expiry as the lock) records the owner, the holder's token, the fence and
// the number of holds; the acquire script re-enters for the same owner (one
// more hold, expiry extended to at least the TTL), and release, refresh and
// the local hand-off count holds down in the same scripts.
//
// Every lock value and record carries its layout ("L1|", "R2|": oncekit
// v0.1.0's, which every later version reads). A lock value of another
// layout is held by someone this version does not know, until its PTTL
// runs out; a record of another layout is idem.ErrUnknownLayout, never
// taken over (a rolling deploy's later version, or an earlier one's).
//
// # Idempotency records
//
// Store is also an idem.Store: a record is one string, of layout R2,
// "oncekit:idem:{K}" (WithRecordPrefix) holding its state, fence, flags,
// the claim's token, the fingerprint and the result (an in-flight
// record's: its attempt), whose PTTL is the result's retention, or the
// claim's lease + idem.AttemptMemory (24 h: a claim whose lease ran out
// stays as the memory of an attempt); "oncekit:idem:{K}:done" is the
// channel completion and abandonment are announced on, only when a
// duplicate waits. The fence is issued as a lock's is. A new key costs one
// write to claim and one to complete (Begin and Complete are one script
// each); an abandoned record becomes a tombstone that keeps its fence and
// attempt for idem.AttemptMemory. Once most of a Store's recent Begins
// found their key completed, a Begin first reads the record with one plain
// GET, which answers a replay without the script (not WithReplicas).
// Anything else under the record's name is
// idem.ErrCorruptRecord.
package redisstore
