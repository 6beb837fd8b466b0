package memstore

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/lock/lockdriver"
	"github.com/oncekit/oncekit/core/observe"
	"github.com/oncekit/oncekit/storage/internal/token"
)

type waiter struct {
	ttl     time.Duration
	owner   string
	granted chan *lease // buffered(1): the lease handed off on release
	elem    *list.Element
	freed   time.Time // when the key was handed off
}

// A grant is held, released or lost, like its leases.
type grantState = lockdriver.State

// grant is one acquisition of a key: its token, fence and expiry, shared
// by the leases (handles) of an owner that re-entered it.
type grant struct {
	s       *Store
	key     string
	token   string
	fence   uint64
	owner   string
	holds   int
	state   grantState
	expires time.Time
	timer   *time.Timer
	handles map[*lease]struct{}
}

// lease is one handle on a grant: what Acquire returns. Its lifecycle is
// lockdriver.Control's, without a timer of its own: the grant's ends it.
type lease struct {
	lockdriver.Control
	g *grant
}

// TryAcquire implements lock.Locker.
func (s *Store) TryAcquire(ctx context.Context, key string, ttl time.Duration) (lock.Lease, error) {
	owner, err := check(ctx, key, ttl)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, closedErr("try acquire", key)
	}
	e := s.entryLocked(key)
	if h := e.holder; h != nil {
		if owner != "" && h.owner == owner {
			return h.reenterLocked(ttl).Lease(), nil
		}
		return nil, &lock.BusyError{Key: key, TTL: time.Until(h.expires)}
	}
	return s.grantLocked(key, e, ttl, owner).Lease(), nil
}

func check(ctx context.Context, key string, ttl time.Duration) (string, error) {
	if err := lockdriver.Validate(key, ttl); err != nil {
		return "", err
	}
	owner := lock.Owner(ctx)
	if err := lockdriver.ValidateOwner(owner); err != nil {
		return "", err
	}
	if err := ctx.Err(); err != nil {
		return "", errors.Join(lock.ErrNotAcquired, err)
	}
	return owner, nil
}

// Acquire implements lock.Locker. Waiters are served first come, first
// served: a release hands the key straight to the longest waiter. An owner
// (lock.WithOwner) that holds the key re-enters it at once.
func (s *Store) Acquire(ctx context.Context, key string, ttl time.Duration) (lock.Lease, error) {
	owner, err := check(ctx, key, ttl)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, closedErr("acquire", key)
	}
	e := s.entryLocked(key)
	if h := e.holder; h == nil {
		l := s.grantLocked(key, e, ttl, owner)
		s.mu.Unlock()
		return l.Lease(), nil
	} else if owner != "" && h.owner == owner {
		l := h.reenterLocked(ttl)
		s.mu.Unlock()
		return l.Lease(), nil
	}
	w := &waiter{ttl: ttl, owner: owner, granted: make(chan *lease, 1)}
	w.elem = e.waiters.PushBack(w)
	s.mu.Unlock()

	select {
	case l := <-w.granted:
		observe.Record(ctx, s.observer, observe.Event{
			Op: observe.LockHandOff, Driver: "memory", Key: key, Outcome: observe.Local,
			Fence: l.g.fence, Duration: time.Since(w.freed),
		})
		return l.Lease(), nil
	case <-ctx.Done():
	case <-s.closing:
	}
	s.mu.Lock()
	if w.elem != nil { // still queued: leave the queue, nothing to undo
		e.waiters.Remove(w.elem)
		w.elem = nil
		s.dropIfIdleLocked(key, e)
		s.mu.Unlock()
		if ctx.Err() == nil {
			return nil, closedErr("acquire", key)
		}
		return nil, errors.Join(lock.ErrNotAcquired, ctx.Err())
	}
	s.mu.Unlock()
	// The key was handed off while ctx ended: the acquisition happened,
	// so it is returned rather than thrown away.
	return (<-w.granted).Lease(), nil
}

// entryLocked returns key's entry, creating it, after ending a holder whose
// TTL has run out (its timer may not have fired yet).
func (s *Store) entryLocked(key string) *entry {
	if e := s.locks[key]; e != nil {
		if h := e.holder; h != nil && !time.Now().Before(h.expires) {
			s.loseLocked(h) // may hand the key on, or drop the entry
		}
	}
	e := s.locks[key]
	if e == nil {
		e = &entry{}
		s.locks[key] = e
	}
	return e
}

func (s *Store) dropIfIdleLocked(key string, e *entry) {
	if e.holder == nil && e.waiters.Len() == 0 && s.locks[key] == e {
		delete(s.locks, key)
	}
}

// nextFenceLocked advances the Store's fence counter to max(counter + 1,
// the clock in microseconds): a Store made after a process restart starts
// above every fence the previous process issued, as long as the clock has
// not stepped back past them.
func (s *Store) nextFenceLocked() uint64 {
	s.fence = max(s.fence+1, uint64(time.Now().UnixMicro()))
	return s.fence
}

func (s *Store) grantLocked(key string, e *entry, ttl time.Duration, owner string) *lease {
	s.nextFenceLocked()
	g := &grant{
		s:       s,
		key:     key,
		token:   token.New(),
		fence:   s.fence,
		owner:   owner,
		expires: time.Now().Add(ttl),
		handles: map[*lease]struct{}{},
	}
	g.timer = time.AfterFunc(ttl, g.expire)
	e.holder = g
	return g.handleLocked()
}

func (g *grant) handleLocked() *lease {
	l := &lease{g: g}
	l.Init(lockdriver.Config{Driver: "memstore", Key: g.key, Token: g.token, Fence: g.fence, Store: l})
	g.handles[l] = struct{}{}
	g.holds++
	return l
}

// reenterLocked gives the owner another hold on its grant, extending the
// expiry to at least ttl from now.
func (g *grant) reenterLocked(ttl time.Duration) *lease {
	if exp := time.Now().Add(ttl); exp.After(g.expires) {
		g.expires = exp
		g.timer.Reset(ttl)
	}
	return g.handleLocked()
}

// handOffLocked gives a free key to the first waiter, or forgets the key.
func (s *Store) handOffLocked(key string, e *entry) {
	if front := e.waiters.Front(); front != nil {
		w := e.waiters.Remove(front).(*waiter)
		w.elem = nil
		w.freed = time.Now()
		w.granted <- s.grantLocked(key, e, w.ttl, w.owner)
		return
	}
	s.dropIfIdleLocked(key, e)
}

// endLocked ends a grant (its TTL ran out, or its last hold was released):
// every handle's Done closes and the key passes on.
func (s *Store) endLocked(g *grant, st grantState) {
	g.state = st
	g.timer.Stop()
	for l := range g.handles {
		l.End(st)
	}
	g.handles = nil
	if e := s.locks[g.key]; e != nil && e.holder == g {
		e.holder = nil
		s.handOffLocked(g.key, e)
	}
}

func (s *Store) loseLocked(g *grant) { s.endLocked(g, lost) }

func (g *grant) expire() {
	g.s.mu.Lock()
	defer g.s.mu.Unlock()
	if g.state != held {
		return
	}
	if d := time.Until(g.expires); d > 0 { // refreshed after the timer fired
		g.timer.Reset(d)
		return
	}
	g.s.loseLocked(g)
}

// heldLocked reports whether g is still live, ending it if its TTL has run
// out.
func (g *grant) heldLocked() bool {
	if g.state != held {
		return false
	}
	if !time.Now().Before(g.expires) {
		g.s.loseLocked(g)
		return false
	}
	return true
}

// StoreRefresh implements lockdriver.Store: it extends the key (all of an
// owner's holds share its expiry).
func (l *lease) StoreRefresh(ctx context.Context, ttl time.Duration) (time.Time, error) {
	if err := ctx.Err(); err != nil {
		return time.Time{}, fmt.Errorf("memstore: refresh %q: %w", l.g.key, err)
	}
	s := l.g.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if l.State() != lockdriver.Live || !l.g.heldLocked() {
		return time.Time{}, fmt.Errorf("memstore: refresh %q: %w", l.g.key, lock.ErrLockLost)
	}
	// An owner's holds share the grant: one hold's refresh never shortens
	// what another was promised.
	if exp := time.Now().Add(ttl); l.g.holds == 1 || exp.After(l.g.expires) {
		l.g.expires = exp
		l.g.timer.Reset(ttl)
	}
	return time.Time{}, nil
}

// StoreRelease implements lockdriver.Store: it gives this lease's hold
// back; the key is freed with the last hold.
func (l *lease) StoreRelease(context.Context) error {
	s := l.g.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, mine := l.g.handles[l]; !mine || !l.g.heldLocked() {
		return fmt.Errorf("memstore: release %q: %w", l.g.key, lock.ErrLockLost)
	}
	delete(l.g.handles, l)
	if l.g.holds--; l.g.holds == 0 {
		s.endLocked(l.g, released)
	}
	return nil
}

// StoreDeadline implements lockdriver.Deadliner: the key's expiry, which
// all of an owner's holds share.
func (l *lease) StoreDeadline(time.Time) time.Time {
	s := l.g.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if l.State() != lockdriver.Live || !l.g.heldLocked() {
		return time.Time{}
	}
	return l.g.expires
}

// entry is the state of one key: its holder and the FIFO of waiters.
type entry struct {
	holder  *grant
	waiters list.List // of *waiter
}

const (
	held     = lockdriver.Live
	released = lockdriver.Released
	lost     = lockdriver.Lost
)
