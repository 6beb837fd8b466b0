package redlockstore

import (
	"time"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/storage/internal/rediskit"
)

// This file keeps a hot key's hold after a Release, for the Store's own
// next Acquire of the key (WithLinger): that Acquire takes the key with no
// round: the same token on the same nodes, the next fence the hold
// reserved (fenced mode: rediskit's fence.lua, through the write-back) or
// 0 (unfenced), the hold's validity.

// keep keeps l's hold for this Store's next Acquire of its key instead of
// releasing it on the nodes, when the key is hot here and the hold may
// serve another lease. It reports whether it did.
func (s *Store) keep(l *lease) bool {
	if s.linger <= 0 || !l.hot || !s.mayReuse(l) {
		return false
	}
	deadline := l.Deadline()
	if !time.Now().Before(deadline) || !s.kept.Put(l.Key(), l, deadline, s.linger, s.letGo) {
		return false
	}
	l.passed.Store(true)
	return true
}

// mayReuse reports whether l's hold may serve another lease: not an
// owner's re-entry, with a reserved fence left (fenced mode), and within
// WithMaxLocalHandOffs and WithMaxLocalHold.
func (s *Store) mayReuse(l *lease) bool {
	return l.nodes == nil && (!s.redlock.fenced || l.used+1 < rediskit.HoldFences) && s.handOffs.Left(int(l.used), l.took)
}

// letGo releases a kept hold nobody took on the nodes.
func (s *Store) letGo(l *lease) {
	s.recent.Wasted(l.Key())
	s.releaseHeld(l, 0)
}

// takeKept serves an Acquire of key for ttl (not an owner's) from the hold
// this Store kept, if it has one: a lease with no round, or nil once the
// hold, unable to serve (less than 7/8 of ttl left of it, or its hand-off
// budget or time spent), is released.
func (s *Store) takeKept(key string, ttl time.Duration) lock.Lease {
	prev, deadline, ok := s.kept.Take(key)
	if !ok {
		return nil
	}
	if s.mayReuse(prev) && time.Until(deadline) >= ttl-ttl/8 {
		l := s.newLease(key, prev.Token(), prev.base, prev.used+1, deadline, nil, nil)
		l.took, l.hot, l.votes = prev.took, true, prev.votes
		return l.Lease()
	}
	s.recent.LetGo(key)
	s.releaseHeld(prev, s.nodeTimeout(ttl))
	return nil
}

// releaseKept lets every kept hold go, for Close.
func (s *Store) releaseKept() {
	for _, l := range s.kept.Close() {
		s.releaseHeld(l, 0)
	}
}

// releaseHeld ends a kept hold and releases it on every node (the fence
// kept: see release.go), waiting up to wait for the answers.
func (s *Store) releaseHeld(l *lease, wait time.Duration) {
	nt := s.nodeTimeout(max(l.Remaining(), time.Millisecond))
	call := s.releaseCall(l.votes, l.Key(), l.Token(), l.floor(), false, nt/2)
	ended := l.votes.end()
	newRound(s, s.all(), call).settle(wait)
	ended()
}
