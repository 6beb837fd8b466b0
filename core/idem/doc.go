// Package idem is oncekit's idempotency engine: Guard runs a function once
// per key across every process sharing a store and replays its stored
// result to duplicates.
//
// The in-flight record is the lock: the first caller's claim writes it
// with a short lease, duplicates read it (one round trip); the result is
// stored with its retention only while the caller's claim still holds the
// key (one round trip). A run whose claim was lost — its lease ran out and
// someone else claimed the key — can neither store its result nor delete
// the newer claim.
//
//	g, err := idem.NewGuard(store, idem.WithWait(5*time.Second))
//	fp := idem.Fingerprint([]byte(method), []byte(route), body)
//	res, replayed, err := g.Do(ctx, "order:"+orderID, fp, func(ctx context.Context) ([]byte, error) {
//		return placeOrder(ctx, body)
//	})
//
// A key is 1 to lock.MaxKeyLen bytes (else lock.ErrInvalidKey), stored as
// given; a key that starts with "{place}" (Placed) is kept in that
// place's shard. The middlewares (httpmw, grpcmw, kafkamw) scope the
// client's key to its caller and hash it before it reaches the store, so
// one tenant can never replay another's response. Results have a size
// limit (1 MiB by default). What a store implements, and what the
// middlewares build on, is package idemdriver.
//
// # Once, across crashes
//
// The claim stays alive until the run returns, whatever happens to the
// caller's context, and a Complete that fails transiently is retried while
// the claim lives. What a crash between the run's effect and its Complete
// does depends on the effect:
//
//   - An effect in the idempotency store commits with the record (Commit:
//     one Redis script, one etcd transaction, one SQL
//     transaction, one ZooKeeper multi-operation, one memstore critical
//     section): both or neither, so it runs once.
//   - An effect elsewhere, keyed on the stored key the run reads with
//     KeyFrom (a unique column, a conditional write), runs once at its
//     resource.
//   - Any other effect runs at least once: the retry that follows a crash
//     runs it again once the claim's lease has run out.
//
// A run also knows whether it is a retry (AttemptFrom): 1 for the first
// claim of a key, n+1 after n claims ended without completing — a process
// that died or froze mid-run (its lease ran out), a run that failed or
// panicked (abandoned) — for AttemptMemory (24 h) after each. A run whose
// effect is outside oncekit's reach (a payment provider, a shipment API)
// asks that system, on an attempt above 1, what the earlier runs did
// before acting again. The count may be one too high (a claim given back
// before its run began), never too low within the memory.
//
// A claim's fence (FenceFrom) orders the claims of one key; a resource
// shared by many keys (a SKU's stock) takes the fence of a lock on that
// resource instead (package lock).
//
// Every driver — storage/memstore, redisstore, redlockstore, etcdstore,
// sqlstore, zkstore — serves a Guard, waking waiting duplicates without
// polling, and passes the conformance suite in core/idem/idemtest.
package idem
