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
// How it works inside — rounds, fences in one round, hot keys, owners,
// idempotency records — is in docs/drivers.md, "How redlockstore works"
// (https://github.com/oncekit/oncekit/blob/main/docs/drivers.md#how-redlockstore-works).
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
package redlockstore
