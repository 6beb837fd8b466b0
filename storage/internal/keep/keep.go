package keep

import (
	"hash/maphash"
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
//
// It is a fixed table of RecentSlots entries, one per key by a hash of the
// key, and a key let go overwrites whichever key had its slot: a service
// that takes a new key for every request lets thousands of keys go each
// second, and the table costs it one lookup per release and nothing to
// sweep. What it forgets is harmless: a hot key pushed out by another is
// not kept on its next release (one round trip more), a cooling one may be
// kept again sooner.
type Recent struct {
	mu    sync.Mutex
	table table[recent]
}

// RecentSlots is the size of the tables of Recent and Marks.
const RecentSlots = 1024

type recent struct {
	key              string
	letGo, coolUntil time.Duration // since epoch (monotonic); coolUntil 0: not cooling
}

// epoch is what Recent's times count from: monotonic, and never 0.
var epoch = time.Now().Add(-time.Hour)

var seed = maphash.MakeSeed()

// table is a fixed table of RecentSlots entries, one per key by a hash of
// the key; entries of other keys may share a slot, and each entry says
// which key it is for. Not safe for concurrent use.
type table[E any] struct{ slots []E }

// slot returns key's slot, making the table on first use.
func (t *table[E]) slot(key string) *E {
	if t.slots == nil {
		t.slots = make([]E, RecentSlots)
	}
	return &t.slots[maphash.String(seed, key)%RecentSlots]
}

// LetGo notes that the Store has just let key go.
func (r *Recent) LetGo(key string) {
	now := time.Since(epoch)
	r.mu.Lock()
	e := r.table.slot(key)
	if e.key != key {
		*e = recent{key: key}
	}
	e.letGo = now
	r.mu.Unlock()
}

// Wasted notes that the Store let key go after keeping it for nothing: it
// is not hot for CoolFor.
func (r *Recent) Wasted(key string) {
	now := time.Since(epoch)
	r.mu.Lock()
	*r.table.slot(key) = recent{key: key, letGo: now, coolUntil: now + CoolFor}
	r.mu.Unlock()
}

// Hot reports whether the Store let key go less than HotFor ago, and the
// key is not cooling down.
func (r *Recent) Hot(key string) bool {
	now := time.Since(epoch)
	r.mu.Lock()
	e := *r.table.slot(key)
	r.mu.Unlock()
	return e.key == key && now-e.letGo < HotFor && now >= e.coolUntil
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

// Marks remembers which keys were marked in the last For, in a fixed table
// like Recent's (a key marked overwrites whichever key had its slot, and
// is forgotten). The zero value with For set is ready to use; it is safe
// for concurrent use.
type Marks struct {
	For time.Duration

	mu    sync.Mutex
	table table[mark]
}

type mark struct {
	key string
	at  time.Duration // since epoch
}

// Mark marks key now.
func (m *Marks) Mark(key string) {
	now := time.Since(epoch)
	m.mu.Lock()
	*m.table.slot(key) = mark{key: key, at: now}
	m.mu.Unlock()
}

// Marked reports whether key was marked less than For ago.
func (m *Marks) Marked(key string) bool {
	now := time.Since(epoch)
	m.mu.Lock()
	e := *m.table.slot(key)
	m.mu.Unlock()
	return e.key == key && now-e.at < m.For
}
