package rediskit

import (
	"sync"
	"time"
)

// HotFor is how soon after a Store let a key go an Acquire of the same key
// by the Store makes the key hot there: a loop, or a stream of requests for
// one item. A Release of a hot key keeps the hold for the Store's next
// Acquire for a moment (the drivers' WithLinger).
const HotFor = 10 * time.Millisecond

// Recent remembers when a Store last let each key go, for HotFor. The zero
// value is ready to use; it is safe for concurrent use.
type Recent struct {
	mu      sync.Mutex
	at      map[string]time.Time
	sweepAt int // the size at which old entries are next swept out
}

// LetGo notes that the Store has just let key go.
func (r *Recent) LetGo(key string) {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.at == nil {
		r.at, r.sweepAt = make(map[string]time.Time), 1024
	}
	if len(r.at) >= r.sweepAt {
		for k, at := range r.at {
			if now.Sub(at) >= HotFor {
				delete(r.at, k)
			}
		}
		r.sweepAt = max(1024, 2*len(r.at))
	}
	r.at[key] = now
}

// Hot reports whether the Store let key go less than HotFor ago.
func (r *Recent) Hot(key string) bool {
	r.mu.Lock()
	at, ok := r.at[key]
	r.mu.Unlock()
	return ok && time.Since(at) < HotFor
}
