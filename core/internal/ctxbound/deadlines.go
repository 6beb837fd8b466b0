package ctxbound

import (
	"container/heap"
	"sync"
	"time"
)

// deadlines calls the expiry of every lease and of every BoundedContext
// asked for Done at its deadline, on one timer for all of them. Most end
// well before their deadline — a lease is released, a completion or a
// clean-up takes a round trip — and arming a runtime timer for each, then
// stopping it, costs every request a timer of its own and, when it is the
// earliest of its thread, a wake-up of the scheduler's network poller.
// Here the one timer is armed for the earliest deadline and left armed
// when entries go before it: an entry whose deadline is later than one
// already registered touches no timer at all.
var deadlines deadlinesState

type deadlinesState struct {
	mu    sync.Mutex
	heap  deadlineHeap
	timer *time.Timer
	at    time.Time // when timer fires; zero when it is not armed
}

// Entry is one entry: its Owner's ExpireAtDeadline runs (on a
// goroutine of its own) once at has passed, unless the entry left before.
// The owner embeds it and sets Owner before it watches.
type Entry struct {
	at    time.Time
	Owner Expirer
	index int // its place in the heap + 1; 0 when not in it (the zero value)
}

// Expirer is what a deadline ends: a Lease, a BoundedContext. (An
// interface rather than a func: a method value would be an allocation
// per lease.)
type Expirer interface{ ExpireAtDeadline() }

// deadlineHeap is a min-heap of entries by deadline.
type deadlineHeap []*Entry

func (h deadlineHeap) Len() int           { return len(h) }
func (h deadlineHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h deadlineHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i+1, j+1
}
func (h *deadlineHeap) Push(x any) {
	e := x.(*Entry)
	*h = append(*h, e)
	e.index = len(*h)
}
func (h *deadlineHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	e.index = 0
	return e
}

// Watch has e.fire called at at, or moves e there if it is in already.
func (e *Entry) Watch(at time.Time) {
	d := &deadlines
	d.mu.Lock()
	defer d.mu.Unlock()
	e.at = at
	if e.index > 0 {
		heap.Fix(&d.heap, e.index-1)
	} else {
		heap.Push(&d.heap, e)
	}
	if d.at.IsZero() || at.Before(d.at) {
		d.armLocked(at)
	}
}

// Unwatch takes e out before its deadline (a no-op once it fired).
func (e *Entry) Unwatch() {
	d := &deadlines
	d.mu.Lock()
	if e.index > 0 {
		heap.Remove(&d.heap, e.index-1)
	}
	d.mu.Unlock()
}

// armLocked makes the timer fire at at.
func (d *deadlinesState) armLocked(at time.Time) {
	d.at = at
	if d.timer == nil {
		d.timer = time.AfterFunc(time.Until(at), fireDeadlines)
		return
	}
	d.timer.Reset(time.Until(at))
}

// fireDeadlines fires the entries whose deadlines have passed and arms the
// timer for the next.
func fireDeadlines() {
	d := &deadlines
	d.mu.Lock()
	d.at = time.Time{}
	now := time.Now()
	var due []Expirer
	for len(d.heap) > 0 && !now.Before(d.heap[0].at) {
		due = append(due, heap.Pop(&d.heap).(*Entry).Owner)
	}
	if len(d.heap) > 0 {
		d.armLocked(d.heap[0].at)
	}
	d.mu.Unlock()
	// Each on a goroutine of its own, as a timer of its own would: an
	// expiry that waits (a driver's OnEnd taking its Store's lock) must not
	// hold up the others.
	for _, e := range due {
		go e.ExpireAtDeadline()
	}
}
