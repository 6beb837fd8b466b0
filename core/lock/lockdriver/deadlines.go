package lockdriver

import (
	"container/heap"
	"context"
	"sync"
	"time"
)

// deadlines ends the BoundedContexts that were asked for Done (or
// AfterFunc) at their deadlines, on one timer for all of them. Most of
// them end well before their deadline — a completion or a clean-up
// seconds away from it takes a round trip — and arming a runtime timer
// for each, then stopping it, costs every request a timer of its own and,
// when it is the earliest of its thread, a wake-up of the scheduler's
// network poller. Here the one timer is armed for the earliest deadline
// and left armed when contexts end before it: a context whose deadline is
// later than one already registered touches no timer at all.
var deadlines deadlinesState

type deadlinesState struct {
	mu    sync.Mutex
	heap  deadlineHeap
	timer *time.Timer
	at    time.Time // when timer fires; zero when it is not armed
}

// deadlineHeap is a min-heap of bounded contexts by deadline; each knows
// its index, -1 once out of it.
type deadlineHeap []*bounded

func (h deadlineHeap) Len() int           { return len(h) }
func (h deadlineHeap) Less(i, j int) bool { return h[i].deadline.Before(h[j].deadline) }
func (h deadlineHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *deadlineHeap) Push(x any) {
	b := x.(*bounded)
	b.index = len(*h)
	*h = append(*h, b)
}
func (h *deadlineHeap) Pop() any {
	old := *h
	b := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	b.index = -1
	return b
}

// watchDeadline has b ended at its deadline (b.mu is held).
func watchDeadline(b *bounded) {
	d := &deadlines
	d.mu.Lock()
	defer d.mu.Unlock()
	heap.Push(&d.heap, b)
	if d.at.IsZero() || b.deadline.Before(d.at) {
		d.armLocked(b.deadline)
	}
}

// unwatchDeadline forgets b, ended before its deadline (b.mu is held).
func unwatchDeadline(b *bounded) {
	d := &deadlines
	d.mu.Lock()
	if b.index >= 0 {
		heap.Remove(&d.heap, b.index)
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

// fireDeadlines ends the contexts whose deadlines have passed and arms the
// timer for the next.
func fireDeadlines() {
	d := &deadlines
	d.mu.Lock()
	d.at = time.Time{}
	now := time.Now()
	var due []*bounded
	for len(d.heap) > 0 && !now.Before(d.heap[0].deadline) {
		due = append(due, heap.Pop(&d.heap).(*bounded))
	}
	if len(d.heap) > 0 {
		d.armLocked(d.heap[0].deadline)
	}
	d.mu.Unlock()
	for _, b := range due {
		b.end(context.DeadlineExceeded)
	}
}
