package idemdriver

import (
	"context"
	"time"

	"github.com/oncekit/oncekit/core/internal/bounds"
	"github.com/oncekit/oncekit/core/internal/runflags"
)

// AnswersOnReturn marks ctx, passed to Guard.Do, as a run whose answer
// the caller releases as soon as Do returns — what the middlewares do:
// idem.Commit inside the run then refuses effects the caller would commit
// later (idem.ErrCallerCommits).
func AnswersOnReturn(ctx context.Context) context.Context {
	return runflags.WithAnswersOnReturn(ctx)
}

// ClaimTimeout bounds the request that claims a key under
// ClaimOutlivesCaller.
const ClaimTimeout = bounds.Cleanup

// ClaimOutlivesCaller marks ctx, passed to Guard.Do, as a server's
// handling of a request: the one request to the store that claims the key
// is not cut short when ctx ends (the client hung up, or its deadline
// passed), only by ClaimTimeout and the store client's own timeouts. A
// store can then make it on the caller's goroutine (on Redis with
// ContextTimeoutEnabled: the hand-off to a background goroutine, which
// lets a caller leave at once, costs tens of microseconds a request on a
// busy machine). A claim taken for a caller that left meanwhile is given
// back before Do returns ctx's error, as it would be at once without the
// mark; waiting for a duplicate in flight still ends when ctx does.
// httpmw and grpcmw mark their requests so: when a client hangs up while
// the store is stalled, its handler returns once the store answers or
// times out, and nobody waits for that answer.
func ClaimOutlivesCaller(ctx context.Context) context.Context {
	return runflags.WithOutlivesCaller(ctx)
}

// ContextWithWait overrides, for the Guard.Do calls made with the
// returned context, how long a duplicate waits for an in-flight run (see
// idem.WithWait). Middleware uses it to offer waiting per route; d = 0
// fails at once with idem.ErrInFlight.
func ContextWithWait(ctx context.Context, d time.Duration) context.Context {
	return runflags.WithWait(ctx, d)
}
