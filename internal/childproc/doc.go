// Package childproc starts a copy of the running test binary as another
// process of a conformance suite — a lock holder (locktest), an
// idempotency runner (idemtest) — and waits for it to say it is ready.
// The child runs no test: the driver's TestMain sees the suite's
// environment variables and does the child's work.
package childproc
