// Package httpmw makes net/http handlers idempotent, following the IETF
// Idempotency-Key draft and Stripe's practice: a client sends a key with a
// request, and however many times the request arrives — a retry after a
// timeout, a double click, a proxy resending — the handler runs once and
// every duplicate gets the first response back.
//
//	guard, _ := idem.NewGuard(store)          // any oncekit driver
//	mw, err := httpmw.New(guard, httpmw.WithScope(principal))
//	...
//	router.With(mw).Post("/orders", place)    // chi, per route; mw(handler) for net/http
//
// Mount it on the routes that need it rather than router-wide: Use(mw)
// would demand a key on every POST, login and webhooks included.
//
// It imports only net/http and oncekit's core; it works with chi and any
// router that takes func(http.Handler) http.Handler.
//
// # Rules
//
//   - Covered methods (POST and PATCH by default, WithMethods) need a key;
//     other methods pass through untouched even with one.
//   - The key comes from the Idempotency-Key header (WithKeyHeader), as a
//     structured-field string ("abc") or bare (abc): both are the same key.
//     1 to 255 bytes of visible ASCII (ParseKey). Missing: 400
//     idempotency_key_missing (or pass through, WithOptionalKey).
//     Malformed or repeated: 400 idempotency_key_invalid.
//   - The stored key is idemdriver.ScopedKey(scope, key), the scope coming from
//     WithScope (the authenticated principal, say), so one principal can
//     never replay another's response. The key space is an explicit
//     choice: New fails unless it gets exactly one of WithScope and
//     Unscoped (one key space for every client). A scope function that
//     returns "" for a request: 500 idempotency_scope_empty, nothing run.
//   - The fingerprint is a SHA-256 over the method, the path with its
//     query, the Content-Type and the body. The body is read up to WithMaxBody (1 MiB; over it: 413
//     body_too_large) and handed on to the handler intact. The same key
//     with another fingerprint: 422 idempotency_key_reused. A body the
//     fingerprint cannot read (JSONFingerprint and a body that is not
//     JSON): 400 request_body_invalid, nothing run.
//   - A duplicate that arrives while the first request runs: 409
//     request_in_flight with Retry-After (the seconds until the first
//     request's claim expires at the latest), or, WithWait, it waits up to a
//     timeout for the response and replays it.
//   - The first response is captured as it goes to the client — status,
//     body and the headers of DefaultReplayHeaders plus WithReplayHeaders,
//     never Set-Cookie, Authorization or hop-by-hop headers — and replayed
//     byte for byte with Idempotent-Replayed: true.
//   - Stored (final): 2xx, 3xx, and 4xx except 401, 403, 408, 409, 425
//     and 429 (DefaultFinal). Not stored, so that a retry runs the handler
//     again: 5xx, those six 4xx, a panic (re-panicked after the claim is
//     dropped), a response over WithMaxResponse, and handlers that flush a
//     stream or hijack the connection — their responses cannot be
//     replayed. The application classifies its own answers: WithFinal
//     replaces DefaultFinal, and a handler marks one response final with
//     Final(w) — a business 409 sold_out, say, which a retry after a
//     restock must see again. The middleware's own 409 request_in_flight
//     is never stored.
//   - The store unreachable: 503 store_unavailable, nothing run (fail
//     closed), unless WithFailOpen, which runs the handler without
//     idempotency.
//   - A stored record that cannot be read: 500 stored_response_corrupt;
//     it is never treated as absent (oncectl record delete removes it).
//   - A request body that cannot be read (a broken chunked encoding, a
//     client gone): 400 request_body_unreadable, nothing run.
//   - A handler that commits an effect with its response (Commit): the
//     effect refused by its own condition, 409 effect_refused; a success
//     that cannot be stored (over WithMaxResponse, not final, a stream)
//     or an effect the store failed, 500 effect_not_committed — nothing
//     done either way (an error answer of the handler's own is passed on).
//
// Every error response is RFC 9457 application/problem+json with a stable
// "code" member (Problem). The handler finds its claim's fence (Fence) and
// its stable stored key (Key) in its request context: the fence for its
// own fenced writes, the key to make an effect outside the idempotency
// store run once (a unique column keyed on it).
//
// # Once, and what a crash does
//
// The claim stays alive until the handler returns, whatever the client
// does (a client that hangs up does not free the key). The request that
// claims the key is not cut short by a client that hangs up either
// (idemdriver.ClaimOutlivesCaller: the store can make it on the handler's
// goroutine); a claim taken for a client that left is given back before
// the handler would run. A replica that dies
// after the handler's effect and before the response is stored leaves the
// claim to expire, and the retry runs the handler again: an effect in
// another system runs at least once unless it is keyed on Key; an effect
// in the idempotency store itself can commit together with the record
// (see the idem package).
//
// WithRoute names routes for metrics; with chi, mount the middleware with
// r.With(mw) on the routes, where chi.RouteContext(r.Context()).RoutePattern()
// is already known, or name the route from the path.
//
// # The client side
//
// Transport is an http.RoundTripper for clients: it gives each POST and
// PATCH one key (a version 7 UUID, or the one set with ContextWithKey)
// and keeps it across retries when it wraps the retrying transport:
//
//	client := &http.Client{Transport: &httpmw.Transport{
//		Base: &retryablehttp.RoundTripper{Client: retryablehttp.NewClient()},
//	}}
//
// Inside a retry loop it would give every attempt a new key.
//
// Requests report to the Guard's observer as OpRequest events
// with the route (WithRoute) and the outcome: executed, replayed,
// in_flight, mismatch, invalid, canceled or error.
package httpmw
