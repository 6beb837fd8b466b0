// Package grpcmw makes gRPC services idempotent, on the same idem.Guard as
// package httpmw: a client sends a key with a call, and however many times
// the call arrives — a retry after a timeout, a proxy resending — the
// handler runs once and every duplicate gets the first reply back.
//
//	guard, _ := idem.NewGuard(store)                 // any oncekit driver
//	unary, err := grpcmw.UnaryServerInterceptor(guard, grpcmw.WithScope(principal))
//	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(unary))
//
//	conn, _ := grpc.NewClient(addr, grpc.WithChainUnaryInterceptor(grpcmw.UnaryClientInterceptor()))
//
// # Rules (UnaryServerInterceptor)
//
//   - The key comes from the "idempotency-key" metadata (WithKeyMetadata),
//     or from the request through WithKeyExtractor (an AIP-155 request_id
//     field): 1 to 255 bytes of visible ASCII, as in HTTP
//     (idemdriver.CheckClientKey). Missing or invalid: InvalidArgument (or pass
//     through when missing, WithOptionalKey). WithSelector limits the
//     interceptor to the methods that need it.
//   - The stored key is idemdriver.ScopedKey of the scope (WithScope: the
//     principal; or Unscoped — the choice is explicit), the full method
//     name and the key.
//   - The fingerprint is a SHA-256 over the full method name and the
//     request's deterministic protobuf encoding. The same key with another
//     request: FailedPrecondition.
//   - A duplicate while the first call runs: Aborted with a RetryInfo
//     detail (the time until the first call's claim expires at the
//     latest), or WithWait: it waits for the reply and replays it.
//   - The reply is stored as its bytes and full type name; a duplicate gets
//     an equal message and "idempotent-replayed: true" header metadata.
//   - Errors of the handler with a code a retry cannot change —
//     InvalidArgument, NotFound, AlreadyExists, PermissionDenied,
//     FailedPrecondition, OutOfRange, Unauthenticated (DefaultFinal;
//     WithFinal reclassifies) — are final: stored and replayed as the same
//     status with its details. Any other error drops the claim, so a retry
//     runs again.
//   - The store unreachable: Unavailable, nothing run (fail closed), unless
//     WithFailOpen.
//   - The handler reads its claim's fence (idem.FenceFrom) and the stable
//     stored key (idem.KeyFrom) from its context — the same accessors as
//     HTTP — so that its effects can commit with the record (idem.Commit)
//     or be deduplicated at their resource. The claim lives until the
//     handler returns, whatever the client's deadline does; the request
//     that claims the key is not cut short by the call's end either
//     (idemdriver.ClaimOutlivesCaller), and a claim taken for a call that ended
//     meanwhile is given back before the handler would run.
//
// # Streams
//
// StreamServerInterceptor runs at most one stream per key at a time: a
// second stream with the key of a running one fails with Aborted (or
// waits). It is a lock, not a replay: nothing a stream sends is stored, and
// once it ends the next stream with its key runs. Use it for streams whose
// effects must not overlap; it does not make a stream's effects happen
// once.
//
// # Clients
//
// UnaryClientInterceptor gives each logical call without a key a fresh
// one (NewKey) before gRPC sends it, so gRPC's own retries — a
// service-config retry policy — carry the same key. With a retry
// interceptor (go-grpc-middleware's retry, say), put this one first, outside
// it:
//
//	grpc.WithChainUnaryInterceptor(grpcmw.UnaryClientInterceptor(), retry.UnaryClientInterceptor(...))
//
// Inside it, every attempt would get a new key and run again on the server
// (TestClientKeyAcrossRetryInterceptor shows both orders).
//
// # Defaults and observability
//
// Without WithSelector the interceptors pass health checks
// (grpc.health.v1) and reflection through without a key. A scope function
// that returns "" refuses the call with Internal. Each unary call reports
// to the Guard's observer as an OpCall event with the full method
// as its route and the outcome: executed, replayed, in_flight, mismatch,
// invalid, canceled or error (promobs and otelobs turn them into metrics
// and spans).
package grpcmw
