// Package redlockstore is the lock.Locker driver over N independent Redis
// servers (N odd, at least 3) with majority quorum: the Redlock algorithm,
// with fencing tokens in one round.
//
//	clients := []redlockstore.Client{c1, c2, c3, c4, c5} // *redis.Client each
//	store, err := redlockstore.New(clients)
//	...
//	defer store.Close()
//	lease, err := store.Acquire(ctx, "order:42", 10*time.Second)
//
// # Rounds
//
// Every round goes to all nodes at once and returns as soon as its outcome
// is decided: a majority answered as needed, or too many refused for a
// majority to remain possible. A node that has not answered within the node
// timeout (default TTL/10, clamped to 50 ms–1 s; WithNodeTimeout) counts as
// failed. An acquisition takes the key on every node it can (one script
// per node: SET NX with the node's fence in the key's value) and succeeds
// with a majority and validity left: validity = TTL − elapsed − drift, where drift
// is 1 % of the TTL + 2 ms (WithDrift). The lease's Done closes when its
// validity ends without a successful Refresh. A failed attempt releases
// every node it took, including nodes whose answer arrives after the round
// ended; and a request that reaches a node after the round's deadline (by
// that node's clock) takes nothing.
//
// Refresh extends the key on every node and succeeds with a majority.
// Release frees it on every node (keeping the lease's fence where the
// node's clock has not passed it, see below) and announces the release on
// each where someone waits.
// Acquire waits for a release message from any node, for the remaining TTL
// of the nodes that stand between it and a majority, or at most the recheck
// interval. A split vote (competing clients each took some nodes, none a
// majority) is settled by the key's leader node, which every client derives
// from the key and only one can hold: its holder keeps its nodes and tries
// the rest again within a few milliseconds, while the others hand theirs
// back without announcing it and wait. Waiters that met contention spread
// their next attempts over a jittered backoff window. Goroutines of one
// Store waiting for one key queue up locally, and only the first competes
// on the nodes. Waiting processes queue on the key's queue nodes — its
// leader node and the quorum − 1 nodes after it, in the order of the
// nodes' addresses, whatever order a process lists them in — in the order they began
// waiting (a sorted set per key, the place given by the client so that
// every node orders them alike), and a release on a queue node wakes only
// the first live member of its queue, on that process's own channel; the
// key's general channel is used when nobody is queued. On the other nodes
// the key is taken and released as a key nobody waits for (the short
// scripts, no announcement). As on redisstore, the key then stays reserved
// on each queue node for the woken member until it tries again or its
// grace runs out (bounded barging): every majority includes a queue node,
// so nobody else can take the key meanwhile. A member woken on its own
// channel tries again once a majority of the nodes have announced the
// release there — every queue node (or 3 ms after the first did): the
// first node's message can come before the others have processed the
// release, and an attempt sent at once would find the key still held
// there. A waiter whose last round found the key held (with no node
// failing), and that no release has woken since (its first round in the
// queues, a recheck), asks the queue nodes only: they are a majority, and
// the other nodes would only answer busy; any other outcome sends its
// next round to every node.
// A waiter subscribes on the queue nodes before it joins the queues
// (a subscription stays a second after its last waiter left, for the
// process's next wait), and polls while a subscription is unconfirmed. A
// first attempt that finds the key held and other processes queued on
// most of the queue nodes that answered marks the key
// for a second: the Store's next waits for it join the queues in their
// first round (one round per turn instead of two when processes take a
// key in turns; a key only this process takes is never marked, since a
// member of the queues sends every release down the queue's longer path).
// A waiter leaves the queues when it gives
// up, and the nodes it did not take when it wins. A node that leaves
// requests unanswered for half a second (paused, partitioned) or whose
// last request failed is not waited for by rounds whose outcome it can no
// longer change, nor by clean-up rounds.
//
// # Fences in one round
//
// In fenced mode (the default) each node issues a fence when the key is
// taken there, as redisstore does: max(the key's last fence + 1, the
// node's clock in µs), kept in the key's value. A lease's fence T is the
// highest fence among the nodes of its majority. It is granted only if T
// is no more than TTL/2 ahead of the clock of every node it took (each
// node's reply carries its clock); otherwise the acquisition gives the
// nodes back and fails with a *ClockSkewError (errors.Is ErrClockSkew and
// lock.ErrNotAcquired). Release, and Complete and Abandon of a claim,
// carry T to every node, which keeps it as the key's last fence while its
// own clock has not passed it. A release knows that of each node whose
// answer it has: the clock the node reported when it took the key, plus
// the time passed since its answer, less 1 %, is a lower bound on its
// clock now. Past T, the node's key is deleted; short of T, it becomes a
// tombstone of T that expires when the node's clock passes T. Neither
// reads the clock; only a node whose answer had not come when the release
// began reads its clock to tell.
//
// Why this is sound: take two granted leases A and B. Their majorities
// share a node n, and on n the two keys existed at different times (the
// node enforces SET NX), say A's first. If A released n, n kept T(A) or
// its clock had passed T(A), so B's fence on n, at least max(last + 1,
// clock), is above T(A). If A's key expired on n, it did so a TTL after it
// was set, by n's clock; when A was granted, T(A) was at most TTL/2 ahead
// of that clock, so n's clock had passed T(A) before B took n. Either way
// T(B), a maximum that includes n's fence, exceeds T(A): fences are unique
// and ordered as the keys were held. The argument needs each node's clock
// not to step back and to run at its rate to within TTL/2 over a TTL (and
// within 1 % of the client's over a hold) — not the nodes' clocks to agree
// with each other, nor the client's.
//
// A node that loses its data (a restart without persistence) issues fences
// from its clock again, above everything it issued before as long as its
// clock did not step back; as long as no more than N − quorum of the nodes
// a hold took lose theirs before their clocks pass T, every majority still
// meets a node that kept T. WithoutFencing takes the keys without issuing fences
// (Fence() is then 0) for callers that only need exclusion; a blocking
// Acquire's first attempt at a key not seen contended lately is then a
// plain SET NX per node, as redsync's (a node that has the key in any form
// gets the script next).
//
// # Hot keys
//
// A key this Store asks for again within 10 ms of releasing it is hot here
// (a loop, a stream of orders for one item), unless a kept hold of it went
// unused in the last 100 ms (two processes taking turns): its Release keeps the hold on
// the nodes for WithLinger (default 100 µs), and the Store's next Acquire
// of the key in that moment takes it with no round: the same token on the
// same nodes, the hold's validity, and the next of the hold's 128 fences
// (T, T + 1, …, T + 127 for the hold's fence T; its release leaves every
// node T + 127, and a node whose key expired issues at least its clock, a
// TTL on, so every later T is above them by the argument above). Within WithMaxLocalHandOffs
// leases in a row (default 16) or as many as start within WithMaxLocalHold
// of taking the key (default 1 ms), whichever is more, the key is then
// released so that waiting processes get their turn. The price: the key
// stays held for up to the linger after Release returns, and a process
// that exits in that moment without Close leaves it held until its TTL
// ends. Close releases kept holds.
//
// # Limits: node restarts
//
// Exclusion rests on the holder's key surviving on a majority. A node that
// restarts without its data (no persistence) and rejoins at once can hand
// the key to a second client while the first lease is still valid, if it
// was part of the holder's bare majority. The rule: a node that lost its
// data must stay out for at least the longest TTL in use (the delayed
// restart), or run with AOF and fsync=always. Up to N − quorum nodes
// restarting empty at once is safe when the holder took every node, and the
// tests show both cases.
//
// Clocks still matter for validity: a node whose clock runs fast expires a
// key early, which the drift allowance covers only up to 1 %.
//
// # Owners
//
// With lock.WithOwner, each node keeps an owner hash beside the key (owner,
// token, holds, the fence it issued).
// An owner re-enters when a majority of nodes count one more hold under the
// same token; the re-entered lease refreshes and releases only those nodes,
// and any other hold the round took is given back.
//
// # Idempotency records
//
// Store is also an idem.Store: each node keeps the record redisstore keeps;
// a claim holds with a majority of nodes, a completed record found on any
// node wins, and Complete, Abandon and Extend need a majority. A claim's
// fence is a lock's: the highest its majority issued, checked against
// their clocks, so Begin on a fresh key is one round.
//
// Because a completed record on any node wins, a Complete that fails —
// idem.ErrLockLost when the claim is no longer held on a majority (its
// lease ran out, or the record was deleted meanwhile), or a *QuorumError —
// may still have stored the result on the nodes where the claim was
// still held, and a later Begin that reaches one of them replays it. The
// run did happen; a replay of its result is the safer answer than a
// second run. A completion counted only once a majority stored it would
// need a second write per Complete.
package redlockstore
