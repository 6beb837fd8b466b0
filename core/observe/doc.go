// Package observe is how oncekit reports what it does: lock acquisitions
// and releases, waits, hand-offs, lost leases, idempotency claims by
// outcome, store failures and the middleware's decisions.
//
// It has no dependencies outside the standard library. An Observer gets
// Events; adapters turn them into metrics (observe/promobs, Prometheus),
// traces (observe/otelobs, OpenTelemetry) or logs (Logger, log/slog), and
// Multi combines several.
//
// # Where events come from
//
//   - lock.Mutex reports LockAcquire, LockRefresh, LockRelease and LockLost;
//   - idem.Guard reports IdemBegin, IdemComplete, IdemAbandon and IdemLost;
//   - the drivers report LockHandOff, which only they can time;
//   - a middleware reports each request or message under its own Op
//     (httpmw.OpRequest, grpcmw.OpCall, kafkamw.OpMessage), with
//     Event.Request saying what kind of unit it is.
//
// Configure the Observer once, on the driver (every driver has a
// WithObserver option): Mutex, Guard and the middleware built on that
// driver report through it unless they are given their own.
//
// # Cardinality and privacy
//
// Op, Outcome and Driver are small closed sets and safe as metric labels;
// Route is too as long as the middleware is given route patterns, not raw
// paths. Event.Key is the raw key: adapters never use it as a label, and
// Logger writes it hashed (HashKey).
package observe
