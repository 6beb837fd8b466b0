package runflags

import (
	"context"
	"time"
)

type answersKey struct{}

type outlivesKey struct{}

type waitKey struct{}

// WithAnswersOnReturn marks ctx: the caller releases the run's answer as
// soon as Do returns.
func WithAnswersOnReturn(ctx context.Context) context.Context {
	return context.WithValue(ctx, answersKey{}, true)
}

// AnswersOnReturn reports the mark of WithAnswersOnReturn.
func AnswersOnReturn(ctx context.Context) bool {
	v, _ := ctx.Value(answersKey{}).(bool)
	return v
}

// WithOutlivesCaller marks ctx: the claim's request is not cut short when
// ctx ends.
func WithOutlivesCaller(ctx context.Context) context.Context {
	return context.WithValue(ctx, outlivesKey{}, true)
}

// OutlivesCaller reports the mark of WithOutlivesCaller.
func OutlivesCaller(ctx context.Context) bool {
	v, _ := ctx.Value(outlivesKey{}).(bool)
	return v
}

// WithWait sets how long a duplicate waits for an in-flight run (at
// least 0).
func WithWait(ctx context.Context, d time.Duration) context.Context {
	return context.WithValue(ctx, waitKey{}, max(d, 0))
}

// Wait returns the wait WithWait set, or def.
func Wait(ctx context.Context, def time.Duration) time.Duration {
	if d, ok := ctx.Value(waitKey{}).(time.Duration); ok {
		return d
	}
	return def
}
