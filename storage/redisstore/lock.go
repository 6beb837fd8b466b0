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
	"github.com/oncekit/oncekit/storage/internal/redisnotify"
	"github.com/oncekit/oncekit/storage/internal/token"
)

// TryAcquire implements lock.Locker: one round trip, or none when a lease
// of this Store holds the key.
func (s *Store) TryAcquire(ctx context.Context, key string, ttl time.Duration) (lock.Lease, error) {
	owner, err := lockdriver.CheckAcquire(ctx, key, ttl)
	if err != nil {
		return nil, err
	}
	if err := s.closedErr("try acquire", key); err != nil {
		return nil, err
	}
	if l, err := s.takeKept(ctx, key, ttl, owner); l != nil || err != nil {
		return l, err
	}
	s.mu.Lock()
	if ls := s.keys[key]; ls != nil && ls.holder != nil && (owner == "" || ls.holder.owner != owner) {
		ttl := ls.holder.Remaining()
		s.mu.Unlock()
		return nil, &lock.BusyError{Key: key, TTL: ttl}
	}
	s.mu.Unlock()
	l, busy, err := s.attempt(ctx, key, token.New(), ttl, owner, false, false, nil)
	if err != nil {
		return nil, err
	}
	if busy != nil {
		return nil, busy
	}
	s.adopt(l)
	return l.Lease(), nil
}

// adopt records a lease taken in Redis as this Store's holder of its key,
// unless one is recorded already (an owner's re-entry) or the lease has
// ended already (see ended).
func (s *Store) adopt(l *lease) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ls := s.localLocked(l.Key())
	s.markHotLocked(l.Key(), ls)
	if ls.holder == nil && !l.ended() {
		ls.holder = l
	}
}

// takeKept serves an Acquire of key from the hold this Store kept after a
// Release (WithLinger), when it has one: a lease with no round trip, or,
// when the hold cannot serve the call (an owner's, or the hold's budget is
// spent), nothing once the hold is let go.
func (s *Store) takeKept(ctx context.Context, key string, ttl time.Duration, owner string) (lock.Lease, error) {
	s.mu.Lock()
	ls := s.keys[key]
	if ls == nil || ls.kept == nil {
		s.mu.Unlock()
		return nil, nil
	}
	l, letGo := s.takeKeptLocked(key, ls, ttl, owner)
	s.dropIdleLocked(key, ls)
	s.mu.Unlock()
	if l != nil {
		return l.Lease(), nil
	}
	cctx, cancel := lockdriver.CleanupContext(ctx)
	defer cancel()
	if _, err := s.base.Release(cctx, s.client, key, letGo, false, 0, 0, false, 0); err != nil {
		return nil, errors.Join(lock.ErrNotAcquired, fmt.Errorf("redisstore: acquire %q: let go of the kept hold: %w", key, err))
	}
	return nil, nil
}

// Acquire implements lock.Locker. An uncontended call is one round trip.
// While the key is held, the caller waits in this Store's queue for the
// key; the first in the queue subscribes to the key's release channel (one
// shared connection per Store) and tries again when the holder releases,
// when the holder's remaining TTL runs out, or at the latest after the
// recheck interval.
func (s *Store) Acquire(ctx context.Context, key string, ttl time.Duration) (lock.Lease, error) {
	owner, err := lockdriver.CheckAcquire(ctx, key, ttl)
	if err != nil {
		return nil, err
	}
	if err := s.closedErr("acquire", key); err != nil {
		return nil, err
	}
	if l, err := s.takeKept(ctx, key, ttl, owner); l != nil || err != nil {
		return l, err // (an owner's call lets a kept hold go first)
	}
	if owner != "" {
		// An owner first tries the key directly: it may hold it already,
		// here or in another process, and must not queue behind waiters for
		// its own lock.
		l, busy, err := s.attempt(ctx, key, token.New(), ttl, owner, false, false, nil)
		if err != nil {
			return nil, err
		}
		if busy == nil {
			s.adopt(l)
			return l.Lease(), nil
		}
	}
	w := &waiter{ttl: ttl, owner: owner, token: token.New()}
	s.mu.Lock()
	ls := s.localLocked(key)
	s.markHotLocked(key, ls)
	if ls.holder == nil && !ls.handingOff && ls.competitors == 0 && ls.queue.Len() == 0 {
		ls.competitors++
		s.mu.Unlock()
		return s.compete(ctx, key, ls, w)
	}
	w.ev = make(chan event, 1) // hand-offs and turns come to queued waiters only
	w.elem = ls.queue.PushBack(w)
	s.mu.Unlock()
	return s.waitLocally(ctx, key, ls, w)
}

// waitLocally waits in this Store's queue for key until a hand-off brings
// the key, it is w's turn to compete in Redis, or ctx ends.
func (s *Store) waitLocally(ctx context.Context, key string, ls *local, w *waiter) (lock.Lease, error) {
	var quit error
	select {
	case e := <-w.ev:
		if e.lease != nil {
			s.handedOff(ctx, e)
			return e.lease.Lease(), nil
		}
		return s.compete(ctx, key, ls, w)
	case <-ctx.Done():
		quit = lockdriver.NotAcquired(ctx)
	case <-s.sub.Closed():
		quit = fmt.Errorf("redisstore: acquire %q: %w", key, lock.ErrClosed)
	}
	s.mu.Lock()
	if w.elem != nil { // still queued: leave, nothing to undo
		ls.queue.Remove(w.elem)
		w.elem = nil
		s.dropIdleLocked(key, ls)
		s.mu.Unlock()
		return nil, quit
	}
	s.mu.Unlock()
	// An event is on its way: a hand-off in flight, or our turn.
	if e := <-w.ev; e.lease != nil {
		s.handedOff(ctx, e)
		return e.lease.Lease(), nil // the acquisition happened; it is the caller's
	}
	s.mu.Lock()
	ls.competitors--
	s.promoteLocked(key, ls)
	s.mu.Unlock()
	return nil, quit
}

// compete tries Redis until the key is taken or ctx ends. The caller has
// counted w in ls.competitors.
func (s *Store) compete(ctx context.Context, key string, ls *local, w *waiter) (_ lock.Lease, err error) {
	var l *lease
	defer func() {
		s.mu.Lock()
		ls.competitors--
		if l != nil && !l.ended() {
			ls.holder = l
		} else {
			s.promoteLocked(key, ls)
		}
		s.dropIdleLocked(key, ls)
		s.mu.Unlock()
	}()
	l, busy, err := s.attempt(ctx, key, w.token, w.ttl, w.owner, false, s.setNX != nil, &w.seen)
	if err != nil || busy == nil {
		return l.public(), err
	}
	// Wait in the key's queue of processes: a release wakes only the first
	// of them, on its own channel; the general channel carries releases
	// when nobody is queued (and on servers before Redis 7).
	own, err := s.watch(ctx, s.base.OwnChannel(key))
	if err != nil {
		return nil, err
	}
	defer func() {
		if l == nil {
			// Leaving without the key: a release may have granted it to w
			// (or may yet, until w's place goes): give it back now, and
			// mark the token so that a grant still on its way is given
			// back when it arrives.
			s.abandon(w.token)
			s.base.BG.Go(func() { s.releaseToken(key, w.token) })
		}
		s.sub.Unwatch(own)
		s.giveBackAbandoned(key, own.Grants()) // those that came while it was leaving
	}()
	all, err := s.watch(ctx, s.base.Keys.Channel(key))
	if err != nil {
		return nil, err
	}
	defer s.sub.Unwatch(all)
	defer func() {
		// Leaving without the key: give the place up, unless another
		// waiter of this Store is queued for the key and will compete next
		// (the place is the Store's, and it keeps it). The removal is
		// made before the next local waiter may compete: a removal landing
		// after that waiter joined the queue would drop it, and it would
		// wait for the recheck interval instead of a release.
		s.mu.Lock()
		others := ls.queue.Len() > 0
		s.mu.Unlock()
		if l == nil && !others {
			s.leaveQueue(key)
		}
	}()
	backoff := s.base.MinBackoff
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var woken time.Time // when the last release notice arrived
	var sent time.Time  // when the last attempt was sent
	for {
		// Subscribed first, then tried: a release between the two is seen.
		sent = time.Now()
		l, busy, err = s.attempt(ctx, key, w.token, w.ttl, w.owner, true, false, &w.seen)
		if err != nil || busy == nil {
			if l != nil && !woken.IsZero() {
				observe.Record(ctx, s.base.Options.Observer, observe.Event{
					Op: observe.LockHandOff, Driver: driverName, Key: key, Outcome: observe.Notified,
					Fence: l.Fence(), Duration: time.Since(woken),
				})
			}
			return l.public(), err
		}
		woken = time.Time{}
		timer.Reset(s.base.NextWait(own.Subscribed() && all.Subscribed(), busy.TTL, &backoff))
		select {
		case <-own.Wake():
			woken = time.Now()
			if l = s.granted(key, own, w, sent); l != nil {
				observe.Record(ctx, s.base.Options.Observer, observe.Event{
					Op: observe.LockHandOff, Driver: driverName, Key: key, Outcome: observe.Notified,
					Fence: l.Fence(), Duration: time.Since(woken),
				})
				return l.Lease(), nil
			}
		case <-all.Wake():
			woken = time.Now()
		case <-timer.C:
		case <-s.sub.Closed():
			return nil, fmt.Errorf("redisstore: acquire %q: %w", key, lock.ErrClosed)
		case <-ctx.Done():
			return nil, lockdriver.NotAcquired(ctx)
		}
	}
}

// abandon marks tok as a waiter's that left without the key, for as long as
// a grant to it may still come (its place in the queue lives placeLife at
// most after its last attempt).
func (s *Store) abandon(tok string) {
	s.abandoned.Store(tok, struct{}{})
	time.AfterFunc(3*s.base.Recheck+time.Minute, func() { s.abandoned.Delete(tok) })
}

func (s *Store) isAbandoned(tok string) bool {
	_, ok := s.abandoned.Load(tok)
	return ok
}

// releaseToken releases key held by tok, if it still is.
func (s *Store) releaseToken(key, tok string) {
	ctx, cancel := context.WithTimeout(context.Background(), lockdriver.ReleaseTimeout)
	defer cancel()
	_, _ = s.base.Release(ctx, s.client, key, tok, false, 0, 0, false, 0)
}

// leaveQueue removes this Store from key's waiting queue.
func (s *Store) leaveQueue(key string) {
	ctx, cancel := context.WithTimeout(context.Background(), lockdriver.ReleaseTimeout)
	defer cancel()
	_ = s.base.LeaveQueue(ctx, s.client, key)
}

// attempt runs the acquire script once, as a member of the key's waiting
// queue when queued. It returns a lease, or a *lock.BusyError, or an
// error. Nothing is left behind by a failed attempt: after an error that
// may have come after the script ran (a timeout, a cancelled ctx, a broken
// connection) it gives back whatever the attempt may have taken, and the
// script itself refuses to take the key once ctx's deadline has passed by
// the server's clock, for a request that reaches the server late (a paused
// server, a slow network) when the clean-up cannot. With plain (unfenced
// Stores), it first tries the plain SET NX of rediskit's TakeNew, which
// has no such check: as for redsync and redislock, a take that lands after
// ctx ended is given back when its reply comes, or expires with its TTL
// when the reply is lost. When the key is busy
// and seen is not nil, *seen is raised to the highest fence issued for
// the key when the attempt ran (see granted).
func (s *Store) attempt(ctx context.Context, key, tok string, ttl time.Duration, owner string, queued, plain bool, seen *uint64) (*lease, *lock.BusyError, error) {
	start := time.Now()
	deadline, _ := ctx.Deadline()
	undo := func(tok string) {
		cctx, cancel := lockdriver.CleanupContext(ctx)
		defer cancel()
		_, _ = s.base.Release(cctx, s.client, key, tok, false, 0, 0, false, 0)
	}
	// late and undoLate handle the reply to a call ctx gave up on; a ctx
	// that cannot end needs neither (nor their allocations).
	var late func(rediskit.AcquireReply)
	var undoLate func()
	if ctx.Done() != nil {
		late = func(r rediskit.AcquireReply) {
			switch r.Code {
			case rediskit.AcquireTaken:
				undo(tok)
			case rediskit.AcquireReentered:
				undo(r.Token)
			}
		}
		undoLate = func() { undo(tok) }
	}
	if plain && owner == "" && !queued {
		// Unfenced, a blocking Acquire's first attempt is a plain SET NX,
		// which takes a free key in one command; a key that exists in any
		// form goes on to the script. (Not TryAcquire, for which a held
		// key must cost one round trip.)
		took, err := s.base.TakeNew(ctx, s.setNX, key, tok, ttl, undoLate)
		switch {
		case err != nil && ctx.Err() != nil:
			return nil, nil, lockdriver.NotAcquired(ctx)
		case err != nil:
			if !rediskit.IsReply(err) {
				s.base.BG.Go(func() { undo(tok) }) // it may have been set before the connection failed
			}
			return nil, nil, fmt.Errorf("redisstore: acquire %q: %w", key, err)
		case took:
			return s.newLease(key, tok, 0, 0, 0, true, start, ttl, owner), nil, nil
		}
	}
	r, err := s.base.Acquire(ctx, s.client, rediskit.AcquireArgs{
		Key: key, Token: tok, TTL: ttl, Deadline: deadline, Unfenced: s.unfenced, Owner: owner, Queued: queued,
		Grantable: queued && s.base.Grants,
	}, late)
	if err != nil {
		if ctx.Err() != nil {
			return nil, nil, lockdriver.NotAcquired(ctx)
		}
		switch {
		case errors.Is(err, rediskit.ErrNotReplicated) && owner == "":
			// Taken, but not on enough replicas: given back before the
			// call returns, so that the caller finds the key as it was.
			undo(tok)
		case !rediskit.IsReply(err) && owner == "":
			// The script may have run before the connection failed. (An
			// owner's uncertain re-entry cannot be told from its other
			// holds; its expiry bounds it.)
			s.base.BG.Go(func() { undo(tok) })
		}
		return nil, nil, fmt.Errorf("redisstore: acquire %q: %w", key, err)
	}
	switch r.Code {
	case rediskit.AcquireTaken:
		return s.newLease(key, tok, uint64(r.N), r.Fences, r.Clock, r.Plain, start, ttl, owner), nil, nil
	case rediskit.AcquireReentered:
		return s.newLease(key, r.Token, uint64(r.N), 1, 0, false, start, ttl, owner), nil, nil
	case rediskit.AcquireBusy:
		if seen != nil {
			*seen = max(*seen, r.Floor)
		}
		ttl := time.Duration(r.N) * time.Millisecond
		if r.N < 0 {
			ttl = -1
		}
		return nil, &lock.BusyError{Key: key, TTL: ttl}, nil
	default: // rediskit.AcquireLate
		return nil, nil, errors.Join(lock.ErrNotAcquired, context.DeadlineExceeded)
	}
}

// granted returns the lease a release granted w while it waited, if one
// did (see rediskit's release.lua): the key is w's token's already, with
// the fence the release issued.
//
// A grant is used only when it is known to have been made after every
// attempt of w that found the key held: its fence is above the highest
// fence those attempts saw (w.seen), and fences are issued in the server's
// order. A grant read late — w's process stalled, or its pub/sub
// connection was slow — may be older than w's latest attempt: the key it
// granted may have expired since and another holder taken it, which that
// attempt saw. Such a grant is dropped (the key is not w's any more, and w
// is still queued). A grant newer than the attempt dates from after it, so
// its validity counts from when that attempt was sent; one whose validity
// has already run out is dropped too, and w tries again.
func (s *Store) granted(key string, own *redisnotify.Watcher, w *waiter, sent time.Time) *lease {
	var l *lease
	var others []string
	for _, g := range own.Grants() {
		tok, fence, fences, ok := rediskit.ParseGrant(g)
		switch {
		case ok && tok == w.token && l == nil:
			// A grant with less than half its validity left (the attempt it
			// counts from was sent long before the key became w's) is not
			// used: w's next attempt, with the token the key holds, renews
			// it to a full TTL.
			if fence > w.seen && time.Until(sent.Add(w.ttl)) > w.ttl/2 {
				l = s.newLease(key, tok, fence, fences, 0, false, sent, w.ttl, w.owner) // valid from the attempt
			}
		case ok && tok == w.token: // a second grant to w: the first was taken
		default:
			others = append(others, g)
		}
	}
	s.giveBackAbandoned(key, others)
	return l
}

// giveBackAbandoned releases key for each grant to a token of a waiter of
// this Store that left without the key: the key is held for it, and nobody
// will use it.
func (s *Store) giveBackAbandoned(key string, grants []string) {
	for _, g := range grants {
		if tok, _, _, ok := rediskit.ParseGrant(g); ok && s.isAbandoned(tok) {
			s.base.BG.Go(func() { s.releaseToken(key, tok) })
		}
	}
}
