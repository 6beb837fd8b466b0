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
	if !time.Now().Before(deadline) || !s.kept.Put(l.Key(), l, deadline, s.opts.linger, s.letGo) {
		return false
	}
	l.passed.Store(true)
	return true
}

// letGo deletes a kept entry nobody took.
func (s *Store) letGo(l *lease) {
	s.recent.Wasted(l.Key())
	s.bg.Go(l.deleteUntilDone)
}

// takeKept serves an Acquire of key for ttl (not an owner's) from the
// entry this Store kept, if it has one: a lease with no request, or nil
// once the entry, unable to serve (less than 7/8 of ttl left of it, or its
// budget spent, or its session gone), is deleted.
func (s *Store) takeKept(ctx context.Context, key string, ttl time.Duration) lock.Lease {
	if lock.Owner(ctx) != "" {
		return nil
	}
	prev, deadline, ok := s.kept.Take(key)
	if !ok {
		return nil
	}
	if s.mayReuse(prev) && time.Until(deadline) >= ttl-ttl/8 {
		l := newLease(s, prev.sess, key, prev.entry, prev.Token(), "", prev.revision, prev.used+1, deadline)
		l.took, l.hot = prev.took, true
		if prev.sess.add(l) {
			return l.Lease()
		}
		l.EndQuietly(lockdriver.Lost) // the session ended meanwhile, and the entry with it
	}
	s.recent.LetGo(key)
	cctx, cancel := lockdriver.BoundedContext(ctx, time.Now().Add(attemptTimeout))
	defer cancel()
	if _, err := s.c.Delete(cctx, prev.entry); err != nil {
		s.bg.Go(prev.deleteUntilDone)
	}
	return nil
}
