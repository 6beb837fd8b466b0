// Package idem is oncekit's idempotency engine: a Store of idempotency
// records, and Guard, which runs a function once per key across every
// process sharing the Store and replays its stored result to duplicates.
//
// The in-flight record is the lock: the first caller's Begin writes it with
// a short lease, duplicates read it (one round trip); Complete stores the
// result with its retention only while the caller's token still holds the
// key (one round trip). A run whose claim was lost — its lease ran out and
// someone else claimed the key — can neither store its result nor delete
// the newer claim.
//
//	g, err := idem.NewGuard(store, idem.WithWait(5*time.Second))
//	key := idem.ScopedKey(principal, idempotencyKey)
//	fp := idem.Fingerprint([]byte(method), []byte(route), body)
//	res, replayed, err := g.Do(ctx, key, fp, func(ctx context.Context) ([]byte, error) {
//		return placeOrder(ctx, body)
//	})
//
// Keys are scoped (ScopedKey) before they reach the store, so one tenant
// can never replay another's response, and they are stored hashed. Results
// have a size limit (1 MiB by default). Expiry is checked on read as well
// as by the store's own TTLs.
//
// Every driver — storage/memstore, redisstore, redlockstore, etcdstore —
// is an idem.Store and an idem.Waiter, and passes the conformance suite in
// core/idem/idemtest.
package idem
