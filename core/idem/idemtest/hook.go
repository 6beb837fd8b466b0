package idemtest

import (
	"context"
	"time"

	"github.com/oncekit/oncekit/core/idem/idemdriver"
)

// BeforeBegin returns st with before called on the context of each Begin,
// just before the Begin goes to st: a test's hook into the moment a claim
// is on its way to the store (to end the caller's context then, or hold
// the claim back). The Store it returns is only an idemdriver.Store: st's other
// interfaces (idemdriver.Waiter, idemdriver.EffectStore) are not passed on.
func BeforeBegin(st idemdriver.Store, before func(ctx context.Context)) idemdriver.Store {
	return &hookedBegin{Store: st, before: before}
}

type hookedBegin struct {
	idemdriver.Store
	before func(context.Context)
}

func (h *hookedBegin) Begin(ctx context.Context, k idemdriver.Key, fingerprint string, ttl time.Duration) (idemdriver.Claim, error) {
	h.before(ctx)
	return h.Store.Begin(ctx, k, fingerprint, ttl)
}
