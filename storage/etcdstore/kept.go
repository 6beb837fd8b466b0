package etcdstore

import (
	"context"
	"time"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/lock/lockdriver"
)

// This file keeps a hot key's entry after a Release, for the Store's own
// next Acquire of the key (WithLinger): that Acquire takes the key with no
// request — the same entry in the same session, the entry's validity, and
// the entry's next fence (revision × fencesPerEntry() + the leases before).

// kept is an entry of this Store whose lease was released.
type kept struct {
	lease    *lease    // the released lease: its entry, session and fences
	deadline time.Time // the entry's validity
	timer    *time.Timer
}

// mayReuse reports whether l's entry may serve another lease: not an
// owner's, with a fence left, within WithMaxLocalHandOffs and
// WithMaxLocalHold, and its session still alive.
func (s *Store) mayReuse(l *lease) bool {
	select {
	case <-l.sess.done:
		return false
	default:
	}
	return l.owner == "" && uint64(l.used+1) < s.fencesPerEntry() && s.handOffs.Left(int(l.used), l.took)
}

// keepEntry keeps l's entry for this Store's next Acquire of its key
// instead of deleting it, when the key is hot here and the entry may serve
// another lease. It reports whether it did.
func (s *Store) keepEntry(l *lease) bool {
	if s.opts.linger <= 0 || !l.hot || !s.mayReuse(l) {
		return false
	}
	deadline := l.Deadline()
	if !time.Now().Before(deadline) {
		return false
	}
	s.kmu.Lock()
	defer s.kmu.Unlock()
	if !s.keeping || s.kept[l.Key()] != nil {
		return false
	}
	k := &kept{lease: l, deadline: deadline}
	s.kept[l.Key()] = k
	l.passed.Store(true)
	k.timer = time.AfterFunc(s.opts.linger, func() { s.letGo(k) })
	return true
}

// letGo deletes the kept entry k, unless an Acquire took it.
func (s *Store) letGo(k *kept) {
	key := k.lease.Key()
	s.kmu.Lock()
	if s.kept[key] != k {
		s.kmu.Unlock()
		return
	}
	delete(s.kept, key)
	s.kmu.Unlock()
	s.recent.Wasted(key)
	s.bg.Go(k.lease.deleteUntilDone)
}

// takeKept serves an Acquire of key for ttl (not an owner's) from the
// entry this Store kept, if it has one: a lease with no request, or nil
// once the entry, unable to serve (less than 7/8 of ttl left of it, or its
// budget spent, or its session gone), is deleted.
func (s *Store) takeKept(ctx context.Context, key string, ttl time.Duration) lock.Lease {
	if lock.Owner(ctx) != "" {
		return nil
	}
	s.kmu.Lock()
	k := s.kept[key]
	if k == nil {
		s.kmu.Unlock()
		return nil
	}
	delete(s.kept, key)
	k.timer.Stop()
	s.kmu.Unlock()
	prev := k.lease
	if s.mayReuse(prev) && time.Until(k.deadline) >= ttl-ttl/8 {
		l := newLease(s, prev.sess, key, prev.entry, prev.Token(), "", prev.revision, prev.used+1, k.deadline)
		l.took, l.hot = prev.took, true
		if prev.sess.add(l) {
			return l
		}
		l.EndQuietly(lockdriver.Lost) // the session ended meanwhile, and the entry with it
	}
	s.recent.LetGo(key)
	cctx, cancel := lockdriver.CleanupContext(ctx)
	defer cancel()
	if _, err := s.c.Delete(cctx, prev.entry); err != nil {
		s.bg.Go(prev.deleteUntilDone)
	}
	return nil
}

// stopKeeping ends keeping entries, for Close (whose revokes delete the
// kept ones).
func (s *Store) stopKeeping() {
	s.kmu.Lock()
	defer s.kmu.Unlock()
	s.keeping = false
	for key, k := range s.kept {
		k.timer.Stop()
		delete(s.kept, key)
	}
}
