package bg

import "sync"

// Group is a sync.WaitGroup that may be added to while Close waits: work
// started after Wait began runs on the caller's goroutine instead. The zero
// value is ready to use.
type Group struct {
	mu      sync.Mutex
	wg      sync.WaitGroup
	waiting bool
}

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
	g.mu.Unlock()
	go func() {
		defer g.wg.Done()
		f()
	}()
}

// Wait waits for the background work; work started from now on runs
// inline.
func (g *Group) Wait() {
	g.mu.Lock()
	g.waiting = true
	g.mu.Unlock()
	g.wg.Wait()
}
