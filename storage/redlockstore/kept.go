package redlockstore

import (
	"time"

	"github.com/oncekit/oncekit/core/lock"
)

// This file keeps a hot key's hold after a Release, for the Store's own
// next Acquire of the key (WithLinger): that Acquire takes the key with no
// round: the same token on the same nodes, the next fence the hold
// reserved (fenced mode: rediskit's fence.lua, through the write-back) or
// 0 (unfenced), the hold's validity.

// kept is a hold of this Store on a key whose lease was released.
type kept struct {
	lease    *lease    // the released lease: its token and fences
	deadline time.Time // the hold's validity
	timer    *time.Timer
}

// keep keeps l's hold for this Store's next Acquire of its key instead of
// releasing it on the nodes, when the key is hot here and the hold may
// serve another lease. It reports whether it did.
func (s *Store) keep(l *lease) bool {
	if s.linger <= 0 || !l.hot || !s.mayReuse(l) {
		return false
	}
	deadline := l.Deadline()
	if !time.Now().Before(deadline) {
		return false
	}
	s.keptMu.Lock()
	defer s.keptMu.Unlock()
	if s.closing || s.kept[l.Key()] != nil {
		return false
	}
	k := &kept{lease: l, deadline: deadline}
	s.kept[l.Key()] = k
	l.passed.Store(true)
	k.timer = time.AfterFunc(s.linger, func() { s.letGo(k) })
	return true
}

// mayReuse reports whether l's hold may serve another lease: not an
// owner's re-entry, with a reserved fence left (fenced mode), and within
// WithMaxLocalHandOffs and WithMaxLocalHold.
func (s *Store) mayReuse(l *lease) bool {
	return l.nodes == nil && (!s.redlock.fenced || l.used < uint64(s.Reserve)) && s.handOffs.Left(int(l.used), l.took)
}

// letGo releases the kept hold k on the nodes, unless an Acquire took it.
func (s *Store) letGo(k *kept) {
	key := k.lease.Key()
	s.keptMu.Lock()
	if s.kept[key] != k {
		s.keptMu.Unlock()
		return
	}
	delete(s.kept, key)
	s.keptMu.Unlock()
	s.recent.Wasted(key)
	s.releaseNodes(key, k.lease.Token(), s.all(), 0, false)
}

// takeKept serves an Acquire of key for ttl (not an owner's) from the hold
// this Store kept, if it has one: a lease with no round, or nil once the
// hold, unable to serve (less than 7/8 of ttl left of it, or its hand-off
// budget or time spent), is released.
func (s *Store) takeKept(key string, ttl time.Duration) lock.Lease {
	s.keptMu.Lock()
	k := s.kept[key]
	if k == nil {
		s.keptMu.Unlock()
		return nil
	}
	delete(s.kept, key)
	k.timer.Stop()
	s.keptMu.Unlock()
	prev := k.lease
	if s.mayReuse(prev) && time.Until(k.deadline) >= ttl-ttl/8 {
		var fence uint64
		if s.redlock.fenced {
			fence = prev.base + prev.used + 1
		}
		l := s.newLease(key, prev.Token(), fence, k.deadline, nil, nil)
		l.base, l.used, l.took, l.hot = prev.base, prev.used+1, prev.took, true
		return l
	}
	s.recent.LetGo(key)
	s.releaseNodes(key, prev.Token(), s.all(), s.nodeTimeout(ttl), false)
	return nil
}

// releaseKept lets every kept hold go, for Close.
func (s *Store) releaseKept() {
	s.keptMu.Lock()
	s.closing = true
	holds := s.kept
	s.kept = map[string]*kept{}
	s.keptMu.Unlock()
	for _, k := range holds {
		k.timer.Stop()
		s.releaseNodes(k.lease.Key(), k.lease.Token(), s.all(), 0, false)
	}
}
