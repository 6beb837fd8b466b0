package keep

import (
	"sync"
	"time"
)

// HotFor is how soon after a Store let a key go an Acquire of the same key
// by the Store makes the key hot there: a loop, or a stream of requests for
// one item. A Release of a hot key keeps the hold for the Store's next
// Acquire for a moment (the drivers' WithLinger).
const HotFor = 10 * time.Millisecond

// CoolFor is how long a key is not kept again after a kept hold went
// unused for its whole linger: the Store's next Acquire comes too late to
// gain from keeping (two processes taking turns, say), and keeping would
// only hold the other back.
const CoolFor = 100 * time.Millisecond

// Recent remembers when a Store last let each key go, for HotFor, and which
// keys are cooling down (CoolFor). The zero value is ready to use; it is
// safe for concurrent use.
type Recent struct {
	mu      sync.Mutex
	at      map[string]recent
	sweepAt int // the size at which old entries are next swept out
}

type recent struct {
	letGo, coolUntil time.Time
}

// LetGo notes that the Store has just let key go.
func (r *Recent) LetGo(key string) {
	r.note(key, func(e *recent, now time.Time) { e.letGo = now })
}

// Wasted notes that the Store let key go after keeping it for nothing: it
// is not hot for CoolFor.
func (r *Recent) Wasted(key string) {
	r.note(key, func(e *recent, now time.Time) { e.letGo, e.coolUntil = now, now.Add(CoolFor) })
}

func (r *Recent) note(key string, set func(*recent, time.Time)) {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.at == nil {
		r.at, r.sweepAt = make(map[string]recent), 1024
	}
	if len(r.at) >= r.sweepAt {
		for k, e := range r.at {
			if now.Sub(e.letGo) >= HotFor && now.After(e.coolUntil) {
				delete(r.at, k)
			}
		}
		r.sweepAt = max(1024, 2*len(r.at))
	}
	e := r.at[key]
	set(&e, now)
	r.at[key] = e
}

// Hot reports whether the Store let key go less than HotFor ago, and the
// key is not cooling down.
func (r *Recent) Hot(key string) bool {
	r.mu.Lock()
	e, ok := r.at[key]
	r.mu.Unlock()
	now := time.Now()
	return ok && now.Sub(e.letGo) < HotFor && now.After(e.coolUntil)
}

// ReservedFences is how many lease fences one fence issued by the server
// stands for, when a Store hands keys on at all: a hold issued value v
// serves leases with fences ReservedFences × v + 0, 1, … without a round
// trip (rediskit.Base.LeaseFence; etcdstore scales the entry's create
// revision the same way).
const ReservedFences = 128

// HandOffs bounds how long a Store hands a key from lease to lease of its
// own (its waiters, or its next Acquire of a kept key) before it lets the
// key go so that other processes get their turn: Max hand-offs in a row,
// or as many as start within Hold after the Store took the key, whichever
// is more. Max 0 turns hand-offs off.
type HandOffs struct {
	Max  int
	Hold time.Duration
}

// Left reports whether another hand-off may follow n of them on a hold the
// Store took at took.
func (h HandOffs) Left(n int, took time.Time) bool {
	return h.Max > 0 && (n < h.Max || time.Since(took) < h.Hold)
}
