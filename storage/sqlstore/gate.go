package sqlstore

import (
	"container/list"
	"context"
	"errors"
	"sync"
	"time"

	"github.com/oncekit/oncekit/core/lock/lockdriver"
)

// gates let one acquisition of a key at a time wait in the database per
// Store (it holds the key's turn), and none while the Store holds the key;
// the Store's other acquisitions of that key wait here, in the order they
// came. A hot key then costs the database one waiter (one connection, one
// queued statement) per process rather than one per request, and the
// server's queue, one place per process, passes the key from process to
// process in turn. The turn is handed on when the acquisition ends — the
// key taken, or not — never held with the key. A lease of the Store
// released while acquisitions wait here is handed to the first of them
// (handoff.go); when the Store lets the key go, the first competes in the
// database.
type gates struct {
	mu sync.Mutex
	m  map[string]*gate
}

// gate is one key's turn and queue; it goes when neither is in use.
type gate struct {
	turns  int       // acquisitions that hold a turn: 1, or more after a hand-off that did not happen (giveBack)
	holder *hold     // the Store's hold of the key, whose leases hand it on, or nil
	queue  list.List // of *gateWaiter, first come first
}

// gateWaiter is an acquisition waiting in a gate's queue. It is sent one
// message once it has left the queue (elem nil): the turn, or a lease.
type gateWaiter struct {
	ttl  time.Duration // the TTL it asks for
	ch   chan *lease   // buffered: nil is the turn
	elem *list.Element // its place in the queue, nil once it left it
}

// enter waits for key's turn, or for a lease of the key handed to it.
// With the turn, leave hands it on. err is ctx's when it ended first,
// errGateClosed when stop was closed first; a lease handed to the waiter
// meanwhile is then released.
func (g *gates) enter(ctx context.Context, stop <-chan struct{}, key string, ttl time.Duration) (leave func(), handed *lease, err error) {
	g.mu.Lock()
	k := g.gateLocked(key)
	if k.turns == 0 && k.holder == nil {
		k.turns++
		g.mu.Unlock()
		return func() { g.leave(key) }, nil, nil
	}
	w := &gateWaiter{ttl: ttl, ch: make(chan *lease, 1)}
	w.elem = k.queue.PushBack(w)
	g.mu.Unlock()
	select {
	case l := <-w.ch:
		if l == nil {
			return func() { g.leave(key) }, nil, nil
		}
		return nil, l, nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-stop:
		err = errGateClosed
	}
	g.mu.Lock()
	if w.elem != nil {
		k.queue.Remove(w.elem)
		w.elem = nil
		g.dropIdleLocked(key, k)
		g.mu.Unlock()
		return nil, nil, err
	}
	g.mu.Unlock()
	// The turn or a lease is on its way: hand the turn on, give the
	// lease back.
	if l := <-w.ch; l == nil {
		g.leave(key)
	} else {
		rctx, cancel := lockdriver.CleanupContext(ctx)
		_ = l.Lease().Release(rctx) // (a lease not released runs out on its own)
		cancel()
	}
	return nil, nil, err
}

func (g *gates) gateLocked(key string) *gate {
	if g.m == nil {
		g.m = map[string]*gate{}
	}
	k := g.m[key]
	if k == nil {
		k = &gate{}
		g.m[key] = k
	}
	return k
}

func (g *gates) dropIdleLocked(key string, k *gate) {
	if k.turns == 0 && k.holder == nil && k.queue.Len() == 0 && g.m[key] == k {
		delete(g.m, key)
	}
}

// leave gives key's turn back.
func (g *gates) leave(key string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if k := g.m[key]; k != nil {
		k.turns--
		g.promoteLocked(key, k)
	}
}

// hold notes that a lease of the Store holds key: the Store's next
// acquisitions of it wait here for a hand-off. unhold notes that the
// Store let the key go (the lease released without a hand-off, or ended).
func (g *gates) hold(key string, h *hold) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.gateLocked(key).holder = h
}

func (g *gates) unhold(key string, h *hold) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if k := g.m[key]; k != nil && k.holder == h {
		k.holder = nil
		g.promoteLocked(key, k)
	}
}

// promoteLocked gives the turn to the first waiter when nobody of the
// Store holds it or the key.
func (g *gates) promoteLocked(key string, k *gate) {
	if k.turns == 0 && k.holder == nil {
		if front := k.queue.Front(); front != nil {
			w := k.queue.Remove(front).(*gateWaiter)
			w.elem = nil
			k.turns++
			w.ch <- nil
			return
		}
	}
	g.dropIdleLocked(key, k)
}

// first takes the first waiter out of key's queue, for a hand-off; nil
// when none waits. The caller sends it a lease, or gives it back.
func (g *gates) first(key string) *gateWaiter {
	g.mu.Lock()
	defer g.mu.Unlock()
	k := g.m[key]
	if k == nil {
		return nil
	}
	front := k.queue.Front()
	if front == nil {
		return nil
	}
	w := k.queue.Remove(front).(*gateWaiter)
	w.elem = nil
	return w
}

// giveBack gives w, taken by first for a hand-off that did not happen, a
// turn of its own: it waits in the database. (Put back in the queue, it
// could wait for a message it was promised after its ctx ended.)
func (g *gates) giveBack(key string, w *gateWaiter) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.gateLocked(key).turns++
	w.ch <- nil
}

// errGateClosed: the Store closed while an acquisition waited for its turn.
var errGateClosed = errors.New("sqlstore: closed")
