package lock

import "sync"

// MaxFence bounds every fence a driver issues: fences are below 2^53, so a
// Lua script (whose numbers are doubles), JSON and JavaScript hold and
// compare them exactly, as Go's uint64 does. The conformance suite checks
// it on every driver.
const MaxFence = 1<<53 - 1

// FenceGate is the resource side of fencing: it remembers, per resource
// name, the highest fence it has admitted and refuses anything lower. A
// holder whose lease ran out (a GC pause, a stalled VM) and whose key was
// taken by someone else carries a lower fence than the new holder, so its
// late write is refused instead of overwriting newer state.
//
// Equal fences are admitted: one holder may write many times under one
// lease. A FenceGate lives where the protected state lives (next to the
// stock table, the file, the account); in SQL the same rule is
//
//	UPDATE stock SET qty = $1, fence = $2 WHERE sku = $3 AND fence <= $2
//
// and a zero-row result means the fence was stale. The zero value is ready
// to use and safe for concurrent use.
type FenceGate struct {
	mu   sync.Mutex
	last map[string]uint64
}

// Admit records fence for resource and returns nil, or returns a
// *StaleFenceError (matching ErrStaleFence) when a higher fence was already
// admitted for resource.
func (g *FenceGate) Admit(resource string, fence uint64) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	cur := g.last[resource]
	if err := CheckFence(resource, cur, fence); err != nil {
		return err
	}
	if g.last == nil {
		g.last = make(map[string]uint64)
	}
	g.last[resource] = fence
	return nil
}

// Current returns the highest fence admitted for resource, or 0.
func (g *FenceGate) Current(resource string) uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.last[resource]
}

// CheckFence is the rule FenceGate applies, for resources that keep their
// own record of the last fence (a column, a file header): incoming is
// admitted when it is at least current.
func CheckFence(resource string, current, incoming uint64) error {
	if incoming < current {
		return &StaleFenceError{Resource: resource, Fence: incoming, Current: current}
	}
	return nil
}
