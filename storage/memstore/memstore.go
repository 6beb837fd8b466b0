package memstore

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/internal/token"
)

// Store is the in-process driver. The zero value is not usable; call New.
type Store struct {
	mu    sync.Mutex
	locks map[string]*entry
	fence uint64 // one counter for all keys: strictly increasing per key too
}

// Option configures a Store. There are none yet; the type keeps New's
// signature stable as options are added.
type Option func(*Store)

// New returns an empty Store.
func New(opts ...Option) *Store {
	s := &Store{locks: make(map[string]*entry)}
	for _, o := range opts {
		o(s)
	}
	return s
}

// entry is the state of one key: its holder and the FIFO of waiters.
type entry struct {
	holder  *lease
	waiters list.List // of *waiter
}

type waiter struct {
	ttl     time.Duration
	granted chan *lease // buffered(1): the lease handed over on release
	elem    *list.Element
}

type leaseState int

const (
	held leaseState = iota
	released
	lost
)

type lease struct {
	s     *Store
	key   string
	token string
	fence uint64
	done  chan struct{}

	// guarded by s.mu
	state   leaseState
	expires time.Time
	timer   *time.Timer
}

// TryAcquire implements lock.Locker.
func (s *Store) TryAcquire(ctx context.Context, key string, ttl time.Duration) (lock.Lease, error) {
	if err := lock.Validate(key, ttl); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, errors.Join(lock.ErrNotAcquired, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.entryLocked(key)
	if e.holder != nil {
		return nil, &lock.HeldError{Key: key, TTL: time.Until(e.holder.expires)}
	}
	return s.grantLocked(key, e, ttl), nil
}

// Acquire implements lock.Locker. Waiters are served first come, first
// served: a release hands the key straight to the longest waiter.
func (s *Store) Acquire(ctx context.Context, key string, ttl time.Duration) (lock.Lease, error) {
	if err := lock.Validate(key, ttl); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, errors.Join(lock.ErrNotAcquired, err)
	}
	s.mu.Lock()
	e := s.entryLocked(key)
	if e.holder == nil {
		l := s.grantLocked(key, e, ttl)
		s.mu.Unlock()
		return l, nil
	}
	w := &waiter{ttl: ttl, granted: make(chan *lease, 1)}
	w.elem = e.waiters.PushBack(w)
	s.mu.Unlock()

	select {
	case l := <-w.granted:
		return l, nil
	case <-ctx.Done():
	}
	s.mu.Lock()
	if w.elem != nil { // still queued: leave the queue, nothing to undo
		e.waiters.Remove(w.elem)
		w.elem = nil
		s.dropIfIdleLocked(key, e)
		s.mu.Unlock()
		return nil, errors.Join(lock.ErrNotAcquired, ctx.Err())
	}
	s.mu.Unlock()
	// The key was handed over while ctx ended: the acquisition happened,
	// so it is returned rather than thrown away.
	return <-w.granted, nil
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

func (s *Store) grantLocked(key string, e *entry, ttl time.Duration) *lease {
	s.fence++
	l := &lease{
		s:       s,
		key:     key,
		token:   token.New(),
		fence:   s.fence,
		done:    make(chan struct{}),
		expires: time.Now().Add(ttl),
	}
	l.timer = time.AfterFunc(ttl, l.expire)
	e.holder = l
	return l
}

// handOffLocked gives a free key to the first waiter, or forgets the key.
func (s *Store) handOffLocked(key string, e *entry) {
	if front := e.waiters.Front(); front != nil {
		w := e.waiters.Remove(front).(*waiter)
		w.elem = nil
		w.granted <- s.grantLocked(key, e, w.ttl)
		return
	}
	s.dropIfIdleLocked(key, e)
}

// loseLocked ends a lease whose TTL ran out and passes the key on.
func (s *Store) loseLocked(l *lease) {
	l.state = lost
	l.timer.Stop()
	close(l.done)
	if e := s.locks[l.key]; e != nil && e.holder == l {
		e.holder = nil
		s.handOffLocked(l.key, e)
	}
}

func (l *lease) expire() {
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	if l.state != held {
		return
	}
	if d := time.Until(l.expires); d > 0 { // refreshed after the timer fired
		l.timer.Reset(d)
		return
	}
	l.s.loseLocked(l)
}

func (l *lease) Key() string           { return l.key }
func (l *lease) Token() string         { return l.token }
func (l *lease) Fence() uint64         { return l.fence }
func (l *lease) Done() <-chan struct{} { return l.done }

// heldLocked reports whether l is still the live holder, ending it if its
// TTL has run out.
func (l *lease) heldLocked() bool {
	if l.state != held {
		return false
	}
	if !time.Now().Before(l.expires) {
		l.s.loseLocked(l)
		return false
	}
	return true
}

func (l *lease) Refresh(ctx context.Context, ttl time.Duration) error {
	if err := lock.ValidateTTL(ttl); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memstore: refresh %q: %w", l.key, err)
	}
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	if !l.heldLocked() {
		return fmt.Errorf("memstore: refresh %q: %w", l.key, lock.ErrLockLost)
	}
	l.expires = time.Now().Add(ttl)
	l.timer.Reset(ttl)
	return nil
}

func (l *lease) Release(context.Context) error {
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	if l.state == released {
		return nil
	}
	if !l.heldLocked() {
		return fmt.Errorf("memstore: release %q: %w", l.key, lock.ErrLockLost)
	}
	l.state = released
	l.timer.Stop()
	close(l.done)
	if e := l.s.locks[l.key]; e != nil && e.holder == l {
		e.holder = nil
		l.s.handOffLocked(l.key, e)
	}
	return nil
}

var (
	_ lock.Locker = (*Store)(nil)
	_ lock.Lease  = (*lease)(nil)
)
