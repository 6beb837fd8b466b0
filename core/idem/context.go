package idem

import (
	"context"
)

type fenceKey struct{}

type storedKey struct{}

type attemptKey struct{}

// runValues carries what a Guard's run finds in its context — the claim's
// fence and stored key, the run's effect slot — in one value instead of a
// context.WithValue each: it is made for every claim a Guard runs.
type runValues struct {
	context.Context
	fence   uint64
	key     string
	attempt int
	slot    effectSlot
}

func (v *runValues) Value(key any) any {
	switch key.(type) {
	case fenceKey:
		return v.fence
	case storedKey:
		return v.key
	case attemptKey:
		return v.attempt
	case effectKey:
		return &v.slot
	}
	return v.Context.Value(key)
}

// KeyFrom returns the stored key of the claim a Guard's run executes under
// (the same on every retry of the request or message),
// from the ctx the Guard passed to it. An effect that lives outside the
// idempotency store is made to run once by keying it on this value at its
// resource: a unique index on it, a conditional write, a ledger entry's
// ID. A retry after a crash between the effect and the record then finds
// the effect done. (A fence cannot do this: the retry carries a higher
// one.)
func KeyFrom(ctx context.Context) (string, bool) {
	k, ok := ctx.Value(storedKey{}).(string)
	return k, ok
}

// FenceFrom returns the fence of the claim a Guard's run executes under,
// from the ctx the Guard passed to it. Pass it to the writes the run makes
// (see lock.FenceGate), so that a run whose claim was lost and taken over
// cannot overwrite the newer run's writes.
func FenceFrom(ctx context.Context) (uint64, bool) {
	f, ok := ctx.Value(fenceKey{}).(uint64)
	return f, ok
}

// AttemptFrom returns the attempt number of the claim a Guard's run
// executes under (Claim.Attempt), from the ctx the Guard passed to it: 1
// for the key's first run, more when earlier runs on the key ended without
// completing — their process died, their lease ran out, or they failed.
// A run whose effect is outside oncekit's reach (a payment provider, a
// shipment API) checks there, on an attempt above 1, what the earlier runs
// did before it acts again:
//
//	if n, _ := idem.AttemptFrom(ctx); n > 1 {
//		if p, err := payments.Find(ctx, orderID); err == nil {
//			return p.Receipt(), nil // the crashed run's charge went through
//		}
//	}
func AttemptFrom(ctx context.Context) (int, bool) {
	n, ok := ctx.Value(attemptKey{}).(int)
	return n, ok
}
