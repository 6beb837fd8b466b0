package bg

import (
	"sync"
	"sync/atomic"
	"time"
)

// maxIdle bounds the workers kept waiting; more exit when they finish.
const maxIdle = 256

// idleFor is how long a worker waits for more work before it exits (a
// variable for the tests).
var idleFor = 10 * time.Second

// Group is a sync.WaitGroup that may be added to while Close waits: work
// started after Wait began runs on the caller's goroutine instead. The zero
// value is ready to use.
//
// Work runs on pooled goroutines. A driver's background work is one
// request through a Redis or etcd client, whose call path is deep: a fresh
// goroutine grows its stack by copying two or three times on every request,
// which on a busy server costs more CPU than the request's own system
// calls. A worker that stays keeps its grown stack (until a GC shrinks it).
type Group struct {
	mu      sync.Mutex
	wg      sync.WaitGroup // the work
	running atomic.Int64   // the work in flight (Settle)
	workers sync.WaitGroup // the goroutines that run it
	waiting bool
	idle    []*worker // the most recently parked last
}

type worker struct{ work chan func() }

// Go runs f in the background, or at once when the group is being waited
// for (the Store is closing).
func (g *Group) Go(f func()) {
	g.mu.Lock()
	if g.waiting {
		g.mu.Unlock()
		f()
		return
	}
	g.wg.Add(1)
	g.running.Add(1)
	job := func() {
		defer g.wg.Done()
		defer g.running.Add(-1)
		f()
	}
	if n := len(g.idle); n > 0 {
		w := g.idle[n-1]
		g.idle[n-1] = nil
		g.idle = g.idle[:n-1]
		g.mu.Unlock()
		w.work <- job // buffered: never blocks
		return
	}
	g.workers.Add(1)
	g.mu.Unlock()
	w := &worker{work: make(chan func(), 1)}
	go g.serve(w, job)
}

// serve runs job, then whatever work w is handed, until w has waited idleFor
// for more or the group is being waited for. Its timer is armed once and
// re-armed only when it fires: re-arming a timer on every job may wake a
// sleeping thread of the Go scheduler (its net poller must learn the new
// deadline), a system call and a thread wake-up on the path of every
// request.
func (g *Group) serve(w *worker, job func()) {
	defer g.workers.Done()
	t := time.NewTimer(idleFor)
	defer t.Stop()
	for {
		job()
		g.mu.Lock()
		if g.waiting || len(g.idle) >= maxIdle {
			g.mu.Unlock()
			return
		}
		g.idle = append(g.idle, w)
		g.mu.Unlock()
		parked := time.Now()
		var ok bool
	wait:
		for {
			select {
			case job, ok = <-w.work:
				break wait
			case <-t.C:
				if idle := time.Since(parked); idle < idleFor {
					t.Reset(idleFor - idle) // it fired for an earlier idle spell
					continue
				}
				t.Reset(idleFor)
				if g.retire(w) {
					return
				}
				job, ok = <-w.work // Go took w off the list as the timer fired
				break wait
			}
		}
		if !ok {
			return
		}
	}
}

// retire takes w off the idle list; false when Go has just taken it.
func (g *Group) retire(w *worker) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	for i, x := range g.idle {
		if x == w {
			g.idle = append(g.idle[:i], g.idle[i+1:]...)
			return true
		}
	}
	return false
}

// Settle waits up to timeout until no background work is in flight, and
// reports whether none is; unlike Wait, work may start again after it.
// (For tests that need a quorum store's late node requests to have
// landed.)
func (g *Group) Settle(timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for g.running.Load() > 0 {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(time.Millisecond)
	}
	return true
}

// Wait waits for the background work and then for its goroutines to exit;
// work started from now on runs inline.
func (g *Group) Wait() {
	g.mu.Lock()
	g.waiting = true
	g.mu.Unlock()
	g.wg.Wait()
	g.mu.Lock()
	idle := g.idle
	g.idle = nil
	g.mu.Unlock()
	for _, w := range idle {
		close(w.work)
	}
	g.workers.Wait()
}
