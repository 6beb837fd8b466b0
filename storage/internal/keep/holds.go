package keep

import (
	"sync"
	"time"
)

// Holds is a Store's holds kept after their Release, by key, each until an
// Acquire takes it or its linger runs out (redlockstore, etcdstore;
// redisstore keeps its own beside its local queue). H is the driver's
// released lease. The zero value is ready to use.
type Holds[H any] struct {
	mu     sync.Mutex
	m      map[string]*held[H]
	closed bool
}

type held[H any] struct {
	h        H
	deadline time.Time
	timer    *time.Timer
}

// Put keeps h, valid until deadline, for key, unless the Holds are closed
// or already keep a hold for key. After linger, unless Take took it
// meanwhile, it is dropped and expire(h) runs: the driver lets it go. Put
// reports whether it kept h.
func (k *Holds[H]) Put(key string, h H, deadline time.Time, linger time.Duration, expire func(H)) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed || k.m[key] != nil {
		return false
	}
	if k.m == nil {
		k.m = make(map[string]*held[H])
	}
	e := &held[H]{h: h, deadline: deadline}
	k.m[key] = e
	e.timer = time.AfterFunc(linger, func() {
		k.mu.Lock()
		current := k.m[key] == e
		if current {
			delete(k.m, key)
		}
		k.mu.Unlock()
		if current {
			expire(h)
		}
	})
	return true
}

// Take removes and returns the hold kept for key, with its deadline.
func (k *Holds[H]) Take(key string) (h H, deadline time.Time, ok bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	e := k.m[key]
	if e == nil {
		return h, deadline, false
	}
	delete(k.m, key)
	e.timer.Stop()
	return e.h, e.deadline, true
}

// Close keeps nothing more and returns the holds kept, for the driver to
// let go.
func (k *Holds[H]) Close() []H {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.closed = true
	var out []H
	for key, e := range k.m {
		e.timer.Stop()
		out = append(out, e.h)
		delete(k.m, key)
	}
	return out
}
