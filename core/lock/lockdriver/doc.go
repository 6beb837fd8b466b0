// Package lockdriver is the kit oncekit's drivers are built from; users of
// the lock API never need it.
//
// It holds what every driver does the same way, so that each driver is left
// with its protocol only (the way etcd's concurrency.Session owns the lease
// and leaves Mutex pure protocol):
//
//   - Control and Lease, one acquisition: Control is the driver's side —
//     the lifecycle (held, released or lost), the local deadline timer
//     that closes Done when no Refresh came in time, and the rules every
//     lock.Lease keeps (a Release after a successful Release returns nil,
//     also when the local deadline had passed while the key still lived in
//     the store; a Refresh that lands after the local deadline gives the
//     key back); Lease, which Control.Lease returns, is the user's, with
//     exactly lock.Lease's methods, sealed by construction. A driver
//     supplies a Store: the one request that extends and the one that
//     frees its hold (and, as DoneWatcher or Deadliner, a say in Done and
//     Deadline).
//   - What drivers implement for operators and multi-key takes:
//     Inspector, LockInfo, MultiLocker.
//   - Input checks (Validate, ValidateKey, ValidateTTL, ValidateOwner) with
//     the errors of package lock.
//   - CleanupContext and ReleaseTimeout, for clean-up that must run after
//     the caller's context has ended; ReleaseContext, the context a
//     Release runs in (shared for callers without one of their own);
//     BoundedContext and DeadlineOnly, for work that only a deadline may
//     cut short.
//   - TokenPrefix, how a token is shown to operators.
package lockdriver
