package sqlstore

import (
	"context"
	"errors"
	"sync"
)

// gates let one acquisition of a key at a time wait in the database per
// Store; the Store's other acquisitions of that key wait for their turn
// here, in the order they came. A hot key then costs the database one
// waiter (one connection, one queued statement) per process rather than
// one per request, and the server's queue, one place per process, passes
// the key from process to process in turn. The turn is handed on when
// the acquisition ends — the key taken, or not — never held with the key.
type gates struct {
	mu sync.Mutex
	m  map[string]*gate
}

// gate is one key's turn: a token in a channel of one, and how many
// acquisitions hold or wait for it (the gate goes when none does).
type gate struct {
	turn  chan struct{}
	users int
}

// enter waits for key's turn; leave hands it on. err is ctx's when it
// ended first, errGateClosed when stop was closed first.
func (g *gates) enter(ctx context.Context, stop <-chan struct{}, key string) (leave func(), err error) {
	g.mu.Lock()
	if g.m == nil {
		g.m = map[string]*gate{}
	}
	k := g.m[key]
	if k == nil {
		k = &gate{turn: make(chan struct{}, 1)}
		g.m[key] = k
	}
	k.users++
	g.mu.Unlock()
	out := func() {
		g.mu.Lock()
		if k.users--; k.users == 0 {
			delete(g.m, key)
		}
		g.mu.Unlock()
	}
	select {
	case k.turn <- struct{}{}:
		return func() { <-k.turn; out() }, nil
	default:
	}
	select {
	case k.turn <- struct{}{}:
		return func() { <-k.turn; out() }, nil
	case <-ctx.Done():
		out()
		return nil, ctx.Err()
	case <-stop:
		out()
		return nil, errGateClosed
	}
}

// errGateClosed: the Store closed while an acquisition waited for its turn.
var errGateClosed = errors.New("sqlstore: closed")
