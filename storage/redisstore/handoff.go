package redisstore

import (
	"context"
	"fmt"
	"time"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/lock/lockdriver"
	"github.com/oncekit/oncekit/core/observe"
	"github.com/oncekit/oncekit/internal/rediskit"
)

// This file is the Store's local queue: goroutines of one Store waiting
// for one key, and the hand-off of the key from a lease of the Store
// straight to the next of them.

func (s *Store) localLocked(key string) *local {
	ls := s.keys[key]
	if ls == nil {
		ls = &local{}
		s.keys[key] = ls
	}
	return ls
}

func (s *Store) dropIdleLocked(key string, ls *local) {
	if ls.holder == nil && !ls.handingOff && ls.competitors == 0 && ls.queue.Len() == 0 && s.keys[key] == ls {
		delete(s.keys, key)
	}
}

// promoteLocked lets the first queued waiter compete in Redis when nobody
// of this Store holds or competes for the key.
func (s *Store) promoteLocked(key string, ls *local) {
	if ls.holder != nil || ls.handingOff || ls.competitors > 0 {
		return
	}
	front := ls.queue.Front()
	if front == nil {
		s.dropIdleLocked(key, ls)
		return
	}
	w := ls.queue.Remove(front).(*waiter)
	w.elem = nil
	ls.competitors++
	w.ev <- event{}
}

// leaseEnded forgets l as its key's holder and lets the next local waiter
// compete. The caller must not hold s.mu.
func (s *Store) leaseEnded(l *lease) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ls := s.keys[l.Key()]; ls != nil && ls.holder == l {
		ls.holder = nil
		ls.handOffs = 0
		s.promoteLocked(l.Key(), ls)
	}
}

// handedOff reports a local hand-off received by a waiter.
func (s *Store) handedOff(ctx context.Context, e event) {
	observe.Record(ctx, s.Options.Observer, observe.Event{
		Op: observe.LockHandOff, Driver: driverName, Key: e.lease.Key(), Outcome: observe.Local,
		Fence: e.lease.Fence(), Duration: time.Since(e.freed),
	})
}

// handOff passes l's key to the next local waiter in one round trip, when
// there is one and the hand-off budget allows. It reports whether it took
// care of l's release, and the error for Release to return.
func (s *Store) handOff(ctx context.Context, l *lease) (bool, error) {
	key := l.Key()
	s.mu.Lock()
	ls := s.keys[key]
	if ls == nil || ls.holder != l || ls.handingOff || ls.queue.Len() == 0 || ls.handOffs >= s.maxHandOffs {
		s.mu.Unlock()
		return false, nil
	}
	w := ls.queue.Remove(ls.queue.Front()).(*waiter)
	w.elem = nil
	ls.handingOff = true
	s.mu.Unlock()

	start := time.Now()
	code, fence, err := s.Transfer(ctx, s.client, key, l.Token(), w.token, w.ttl, w.owner)

	s.mu.Lock()
	defer s.mu.Unlock()
	ls.handingOff = false
	if err != nil {
		// The key's state is unknown: l may still hold it, so the caller
		// may retry Release; the waiter competes in Redis meanwhile.
		ls.competitors++
		w.ev <- event{}
		return true, fmt.Errorf("redisstore: release %q: %w", key, err)
	}
	switch code {
	case rediskit.TransferDone:
		next := s.newLease(key, w.token, uint64(fence), start, w.ttl, w.owner)
		ls.holder = next
		ls.handOffs++
		l.EndQuietly(lockdriver.Released)
		w.ev <- event{lease: next, freed: start}
		return true, nil
	case rediskit.TransferHoldReturned:
		// One of an owner's holds given back; the owner still holds the
		// key. The waiter competes in Redis and waits for the last hold.
		if ls.holder == l {
			ls.holder = nil
		}
		l.EndQuietly(lockdriver.Released)
		ls.competitors++
		w.ev <- event{}
		return true, nil
	default: // rediskit.TransferNotOurs
		if ls.holder == l {
			ls.holder = nil
		}
		ls.handOffs = 0
		l.EndQuietly(lockdriver.Lost)
		ls.competitors++
		w.ev <- event{} // the waiter competes in Redis
		return true, fmt.Errorf("redisstore: release %q: %w", key, lock.ErrLockLost)
	}
}
