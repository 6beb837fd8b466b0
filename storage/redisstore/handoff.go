package redisstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/lock/lockdriver"
	"github.com/oncekit/oncekit/core/observe"
	"github.com/oncekit/oncekit/storage/internal/rediskit"
)

// This file is the Store's local queue: goroutines of one Store waiting
// for one key, and the hand-off of the key from a lease of the Store
// straight to the next of them, or to the Store's own next Acquire of the
// key (the key kept for a moment after a Release).
//
// A hand-off without a round trip keeps the Store's hold in Redis (its
// token) and gives the next lease the next fence the hold reserved when
// Redis issued its own (rediskit's fence.lua): fences still rise with
// every lease, and every fence Redis issues later is above them.

func (s *Store) localLocked(key string) *local {
	ls := s.keys[key]
	if ls == nil {
		ls = &local{}
		s.keys[key] = ls
	}
	return ls
}

func (s *Store) dropIdleLocked(key string, ls *local) {
	if ls.holder == nil && ls.kept == nil && !ls.handingOff && ls.competitors == 0 && ls.queue.Len() == 0 && s.keys[key] == ls {
		delete(s.keys, key)
	}
}

// promoteLocked lets the first queued waiter compete in Redis when nobody
// of this Store holds or competes for the key.
func (s *Store) promoteLocked(key string, ls *local) {
	if ls.holder != nil || ls.kept != nil || ls.handingOff || ls.competitors > 0 {
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
	observe.Record(ctx, s.base.Options.Observer, observe.Event{
		Op: observe.LockHandOff, Driver: driverName, Key: e.lease.Key(), Outcome: observe.Local,
		Fence: e.lease.Fence(), Duration: time.Since(e.freed),
	})
}

// handOff passes l's key to the next local waiter, or keeps it for this
// Store's next Acquire, when there is one and the hand-off budget allows:
// without a round trip while the hold allows (reuseLocked), else in one
// (Transfer). It reports whether it took care of l's release, and the
// error for Release to return.
func (s *Store) handOff(ctx context.Context, l *lease) (bool, error) {
	key := l.Key()
	s.mu.Lock()
	ls := s.keys[key]
	if ls == nil || ls.holder != l || ls.handingOff || !s.handOffs.Left(ls.handOffs, l.hold.took) {
		s.mu.Unlock()
		return false, nil
	}
	if ls.queue.Len() == 0 {
		kept := s.keepLocked(key, ls, l)
		s.mu.Unlock()
		return kept, nil
	}
	w := ls.queue.Front().Value.(*waiter)
	if l.owner == "" && w.owner == "" {
		if next := s.reuseLocked(ls, key, l, l.Deadline(), w.ttl); next != nil {
			ls.queue.Remove(w.elem)
			w.elem = nil
			ls.holder = next
			l.passed.Store(true)
			l.EndQuietly(lockdriver.Released)
			w.ev <- event{lease: next, freed: time.Now()}
			s.mu.Unlock()
			return true, nil
		}
	}
	ls.queue.Remove(w.elem)
	w.elem = nil
	ls.handingOff = true
	s.mu.Unlock()

	start := time.Now()
	code, fence, fences, err := s.base.Transfer(ctx, s.client, key, l.Token(), w.token, w.ttl, w.owner)

	s.mu.Lock()
	defer s.mu.Unlock()
	ls.handingOff = false
	if errors.Is(err, rediskit.ErrNotReplicated) {
		// The key passed to the waiter's token on the primary, which its
		// replicas did not acknowledge: l has let it go, and the waiter
		// competes in Redis with that token, which renews the key and
		// waits for the replicas again (or gives the key back).
		if ls.holder == l {
			ls.holder = nil
		}
		ls.handOffs = 0
		l.EndQuietly(lockdriver.Released)
		ls.competitors++
		w.ev <- event{}
		return true, nil
	}
	if err != nil {
		// The key's state is unknown: l may still hold it, so the caller
		// may retry Release; the waiter competes in Redis meanwhile.
		ls.competitors++
		w.ev <- event{}
		return true, fmt.Errorf("redisstore: release %q: %w", key, err)
	}
	switch code {
	case rediskit.TransferDone:
		next := s.makeLease(key, w.token, hold{fence: fence, fences: fences, took: l.hold.took},
			0, start.Add(w.ttl), w.owner)
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

// reuseLocked returns the next lease of the hold l (ended or ending) had,
// for a waiter of this Store asking for ttl, with no round trip: the same
// token, the hold's next reserved fence, the hold's deadline. It counts a
// hand-off. It returns nil when the hold cannot serve: its reserved fences
// or the Store's hand-off budget (WithMaxLocalHandOffs, WithMaxLocalHold)
// are spent, or less than 7/8 of ttl is left of it (a hand-off in one
// round trip renews it).
func (s *Store) reuseLocked(ls *local, key string, l *lease, deadline time.Time, ttl time.Duration) *lease {
	if !s.mayReuse(ls, l) || time.Until(deadline) < ttl-ttl/8 {
		return nil
	}
	ls.handOffs++
	h := l.hold
	h.plain = false // a key passed on is hot: its release goes to the full script at once
	return s.makeLease(key, l.Token(), h, l.used+1, deadline, "")
}

// mayReuse reports whether l's hold may serve another lease without a round
// trip.
func (s *Store) mayReuse(ls *local, l *lease) bool {
	return l.owner == "" && (s.unfenced || l.used+1 < l.hold.fences) && s.handOffs.Left(ls.handOffs, l.hold.took)
}

// kept is a hold of this Store on a key whose lease was released, kept for
// the Store's next Acquire of the key for the linger.
type kept struct {
	lease    *lease    // the released lease: its token and fences
	deadline time.Time // the hold's local deadline
	timer    *time.Timer
}

// keepLocked keeps l's hold for this Store's next Acquire of key, instead
// of letting the key go, when the key is hot here (taken again right after
// the Store last let it go) and l's hold may serve another lease. It
// reports whether it did: l has then ended as released.
func (s *Store) keepLocked(key string, ls *local, l *lease) bool {
	if s.linger <= 0 || !ls.hot || !s.mayReuse(ls, l) || s.closing {
		return false
	}
	deadline := l.Deadline()
	if !time.Now().Before(deadline) {
		return false
	}
	k := &kept{lease: l, deadline: deadline}
	ls.kept, ls.holder = k, nil
	l.passed.Store(true)
	l.EndQuietly(lockdriver.Released)
	k.timer = time.AfterFunc(s.linger, func() { s.letGo(key, k) })
	return true
}

// letGo releases the kept hold k in Redis, unless an Acquire took it.
func (s *Store) letGo(key string, k *kept) {
	s.mu.Lock()
	ls := s.keys[key]
	if ls == nil || ls.kept != k {
		s.mu.Unlock()
		return
	}
	ls.kept, ls.handOffs = nil, 0
	s.recent.Wasted(key)
	s.dropIdleLocked(key, ls)
	s.mu.Unlock()
	s.base.BG.Go(func() { s.releaseToken(key, k.lease.Token()) })
}

// takeKeptLocked serves an Acquire of key for ttl (by owner, or "") from
// the Store's kept hold, if it has one: the lease, without a round trip,
// or, when the hold cannot serve it, the token of the hold for the caller
// to release before it competes.
func (s *Store) takeKeptLocked(key string, ls *local, ttl time.Duration, owner string) (*lease, string) {
	k := ls.kept
	if k == nil {
		return nil, ""
	}
	ls.kept = nil
	k.timer.Stop()
	if owner == "" {
		if l := s.reuseLocked(ls, key, k.lease, k.deadline, ttl); l != nil {
			ls.holder = l
			return l, ""
		}
	}
	ls.handOffs = 0
	s.recent.LetGo(key)
	return nil, k.lease.Token()
}

// markHotLocked marks key hot when this Store let it go less than
// keep.HotFor ago and it is not cooling down (keep.CoolFor): its releases
// are then kept (keepLocked).
func (s *Store) markHotLocked(key string, ls *local) {
	ls.hot = s.recent.Hot(key)
}

// releaseKept lets every kept hold go, for Close.
func (s *Store) releaseKept() {
	s.mu.Lock()
	s.closing = true
	var holds []*kept
	for key, ls := range s.keys {
		if k := ls.kept; k != nil {
			ls.kept = nil
			k.timer.Stop()
			holds = append(holds, k)
			s.dropIdleLocked(key, ls)
		}
	}
	s.mu.Unlock()
	for _, k := range holds {
		s.base.BG.Go(func() { s.releaseToken(k.lease.Key(), k.lease.Token()) })
	}
}
