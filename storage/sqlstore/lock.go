package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/lock/lockdriver"
	"github.com/oncekit/oncekit/core/observe"
	"github.com/oncekit/oncekit/storage/internal/token"
)

// A lock is one row of the locks table: its holder's token (” while
// free), the owner that may re-enter it and how many holds it has, the
// fence of the latest acquisition, and its expiry by the server's clock.
// A released key's row is deleted once the server's clock has passed its
// fence, and kept free until then, so that the next fence, max(fence + 1,
// the clock in µs), is always above the last.
//
// Every change runs in one transaction that locks the key's row first:
// acquisitions, releases, refreshes and the queue of waiters of one key
// are serialised by that row lock, and nothing else.
type lockRow struct {
	found   bool
	token   string
	owner   []byte
	holds   int
	fence   int64
	expires int64 // µs, server clock
	now     int64 // µs, server clock, when the row was read
}

func (r lockRow) held() bool { return r.found && r.token != "" && r.expires > r.now }

// us is d in whole microseconds, at least 1.
func us(d time.Duration) int64 { return max(d.Microseconds(), 1) }

// lease is one hold of a key.
type lease struct {
	lockdriver.Control
	s    *Store
	key  string
	pin  *pin  // the connection keeping the key's session lock, or nil
	hold *hold // the Store's tenure of the row the lease is part of (handoff.go); nil for an owner's hold
}

// grant is the outcome of one attempt to take a key.
type grant struct {
	token string
	fence int64
	busy  time.Duration // when not granted: the holder's TTL, 0 when the free key is kept for a queued waiter
	first bool          // when not granted: the waiter is first in the key's queue
	ahead int           // when not granted and known: how many waiters are queued before it
}

// TryAcquire implements lock.Locker: one transaction.
func (s *Store) TryAcquire(ctx context.Context, key string, ttl time.Duration) (lock.Lease, error) {
	owner, err := lockdriver.CheckAcquire(ctx, key, ttl)
	if err != nil {
		return nil, err
	}
	if err := s.closedErr("try acquire", key); err != nil {
		return nil, err
	}
	if s.sessionQueue && s.takeSlot() {
		return s.acquireQueued(ctx, key, ttl, owner, false)
	}
	start := time.Now()
	g, err := s.attempt(ctx, key, ttl, owner, "", false)
	switch {
	case err != nil && ctx.Err() != nil:
		return nil, lockdriver.NotAcquired(ctx, err)
	case err != nil:
		return nil, err
	case g.token == "":
		return nil, &lock.BusyError{Key: key, TTL: g.busy}
	}
	return s.newLease(key, g, start.Add(ttl), nil, owner).Lease(), nil
}

// Acquire implements lock.Locker. A waiter queues in the database
// server, for a session lock that the holder's connection keeps beside
// the row (see the package documentation): a release lets the next waiter
// take the key in the statement it is waiting in, in the order they came.
// Without a session (WithoutNotify), or with half the pool already kept
// by holders and waiters, a waiter queues in the lock_waiters table
// instead: a released key goes to the longest-queued live waiter, so that
// processes that release and take a key back in a loop cannot starve one
// that waits; the release wakes it by NOTIFY on PostgreSQL with pgx, and
// on MySQL the first waiter looks again every WithPollInterval/10 (5 ms by
// default), the k-th every k times that. Of one Store's acquisitions of a
// key, one at a time waits in the database; the others wait for their
// turn in the process, in the order they came.
func (s *Store) Acquire(ctx context.Context, key string, ttl time.Duration) (lock.Lease, error) {
	owner, err := lockdriver.CheckAcquire(ctx, key, ttl)
	if err != nil {
		return nil, err
	}
	if err := s.closedErr("acquire", key); err != nil {
		return nil, err
	}
	if owner == "" { // (an owner re-enters a key it holds at once)
		leave, handed, err := s.gates.enter(ctx, s.stop, key, ttl)
		if err != nil {
			if cerr := s.closedErr("acquire", key); cerr != nil {
				return nil, cerr
			}
			return nil, lockdriver.NotAcquired(ctx)
		}
		if handed != nil {
			return handed.Lease(), nil
		}
		defer leave()
	}
	if s.sessionQueue && s.takeSlot() {
		return s.acquireQueued(ctx, key, ttl, owner, true)
	}
	locks, _, _ := s.Tables()
	waiter := token.New()
	woken, unsubscribe := s.hub.subscribe(locks, waiter) // before asking: a release in between still wakes us
	defer func() { unsubscribe() }()
	began := time.Now()
	renewed := time.Time{}
	queued := false      // this waiter has a place in the key's queue
	var faulty time.Time // when the database stopped answering, zero while it answers
	// With notifications (PostgreSQL and pgx), the first look is a
	// transaction on the key's row, which queues the waiter in the same
	// step that finds the key held: the release that follows sees it and
	// wakes it. After that, and always without notifications (MySQL),
	// waiters look without locks (MVCC) and keep their place with a plain
	// upsert: only a waiter that was woken, or finds the key free and
	// itself first, takes the row lock, so a crowd of waiters never queues
	// in the database's lock wait ahead of the hand-off.
	look := s.listen || owner != "" // an owner re-enters a key it holds at once
	if !look && s.q.myAcquire != "" {
		// MySQL: a free key nobody waits for is taken by the first
		// statement, as TryAcquire takes it.
		if l, err := s.myFirst(ctx, key, ttl, owner); l != nil || err != nil {
			return l, err
		}
	}
	for n := 0; ; n++ {
		var g grant
		start := time.Now()
		if !look {
			g, look = s.peekKeep(ctx, key, waiter, start, &renewed, &queued)
		}
		if look {
			var err error
			g, err = s.attempt(ctx, key, ttl, owner, waiter, queued)
			if err != nil {
				var again bool
				if again, err = s.keepPlace(ctx, err, queued, &faulty, start); again {
					continue
				}
				s.leaveQueue(ctx, key, waiter, queued || n > 0)
				if ctx.Err() != nil {
					return nil, lockdriver.NotAcquired(ctx, err)
				}
				return nil, err
			}
			faulty = time.Time{}
			renewed, queued = start, g.token == ""
		}
		if g.token != "" {
			if n > 0 {
				s.handedOff(ctx, key, g.fence, began)
			}
			return s.newLease(key, g, start.Add(ttl), nil, owner).Lease(), nil
		}
		t := time.NewTimer(s.pollWait(g, renewed))
		look = false
		select {
		case <-woken:
			unsubscribe()
			woken, unsubscribe = s.hub.subscribe(locks, waiter)
			look = true
		case <-t.C:
		case <-ctx.Done():
		case <-s.stop:
		}
		t.Stop()
		if ctx.Err() != nil {
			s.leaveQueue(ctx, key, waiter, true)
			return nil, lockdriver.NotAcquired(ctx)
		}
		if err := s.closedErr("acquire", key); err != nil {
			s.leaveQueue(ctx, key, waiter, true) // (fails at once if Close closed the database)
			return nil, err
		}
	}
}

// keepPlace decides about an attempt of a waiter that failed with err:
// when the database went away (a crash, a restart, a cut connection), a
// waiter that has a place (queued) keeps it, and asks again (again) after
// a pause until its place would have expired, rather than leave it behind
// for its retry to queue after; *faulty is when the database stopped
// answering (start, the attempt's start, the first time). Otherwise it
// returns the error to fail with.
func (s *Store) keepPlace(ctx context.Context, err error, queued bool, faulty *time.Time, start time.Time) (again bool, _ error) {
	if !queued || !connectionLost(err) || ctx.Err() != nil {
		return false, err
	}
	if faulty.IsZero() {
		*faulty = start
	}
	if pause := faultPause(time.Since(*faulty)); time.Since(*faulty)+pause < s.waiterTTL {
		if sleepCtx(ctx, pause) {
			return true, nil
		}
		return false, ctx.Err()
	}
	return false, err
}

// myFirst takes a free key nobody waits for with one statement (MySQL), as
// TryAcquire does: a lease, or nil and no error when the key is taken.
func (s *Store) myFirst(ctx context.Context, key string, ttl time.Duration, owner string) (lock.Lease, error) {
	start := time.Now()
	g, ok, err := s.myTake(ctx, key, ttl, owner)
	switch {
	case err != nil && ctx.Err() != nil:
		return nil, lockdriver.NotAcquired(ctx, err)
	case err != nil:
		return nil, err
	case ok:
		return s.newLease(key, g, start.Add(ttl), nil, owner).Lease(), nil
	}
	return nil, nil
}

// peekKeep looks at key without locks (MVCC) for a waiter: what holds it
// and the waiter's place, which it renews (an upsert) every third of
// waiterTTL since *renewed. look reports that the waiter should try the
// row instead: the key is free and the waiter first, or a statement
// failed.
func (s *Store) peekKeep(ctx context.Context, key, waiter string, start time.Time, renewed *time.Time, queued *bool) (g grant, look bool) {
	busy, first, ahead, err := s.peek(ctx, key, waiter)
	switch {
	case err != nil, busy == 0 && first:
		return g, true
	}
	g.busy, g.first, g.ahead = busy, first, ahead
	if time.Since(*renewed) >= s.waiterTTL/3 {
		if err := s.queueAlone(ctx, key, waiter); err != nil {
			return g, true
		}
		*renewed, *queued = start, true
	}
	return g, false
}

// pollWait is how long a waiter that found key held (g) sleeps before it
// looks again, unless a release wakes it: at most until its place needs
// renewing (renewed: when it last was); without notifications the first
// waiter looks every pollInterval/10, the k-th every k times that (the
// second must be ready when the first has taken the key; the hundredth
// need not ask often), and every waiter at least once a second; the first
// looks when the holder's row expires, which frees the key without a
// release.
func (s *Store) pollWait(g grant, renewed time.Time) time.Duration {
	wait := s.waiterTTL/3 - time.Since(renewed)
	if !s.listen {
		step := max(s.pollInterval/10, time.Millisecond)
		if g.first {
			wait = min(wait, step)
		} else {
			d := step * time.Duration(min(g.ahead+1, 1000))
			wait = min(wait, d*3/4+rand.N(d/2+1))
		}
	}
	if g.first && g.busy > 0 {
		wait = min(wait, g.busy+time.Millisecond)
	}
	return max(wait, 0)
}

// handedOff reports a hand-off: key taken with fence after a wait that
// began then.
func (s *Store) handedOff(ctx context.Context, key string, fence int64, began time.Time) {
	observe.Record(ctx, s.observer, observe.Event{
		Op: observe.LockHandOff, Driver: s.DriverName(), Key: key, Outcome: observe.Notified,
		Fence: uint64(fence), Duration: time.Since(began),
	})
}

// faultPause is how long a waiter that keeps its place waits before it
// asks again, by how long the database has not answered: 20 ms for the
// first 100 ms, 100 ms for the first second, 250 ms after that.
func faultPause(since time.Duration) time.Duration {
	switch {
	case since < 100*time.Millisecond:
		return 20 * time.Millisecond
	case since < time.Second:
		return 100 * time.Millisecond
	}
	return 250 * time.Millisecond
}

// sleepCtx waits d, or until ctx ends; it reports whether d passed.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// peek reads, without locks, the holder's TTL (0 when key is free),
// whether waiter is first in its queue (or the queue is empty), and how
// many live waiters are queued before it. The first waiter sleeps until
// the holder's expiry at most: a holder that extended its lease since the
// waiter's last look is not missed by a second.
func (s *Store) peek(ctx context.Context, key, waiter string) (busy time.Duration, first bool, ahead int, err error) {
	var remaining sql.NullInt64
	var head sql.NullString
	err = s.queryRow(ctx, s.q.peek, []byte(key), []byte(key), []byte(key), []byte(key), waiter).Scan(&remaining, &head, &ahead)
	if err != nil {
		return 0, false, 0, err
	}
	if remaining.Valid {
		busy = max(time.Duration(remaining.Int64)*time.Microsecond, time.Microsecond)
	}
	return busy, !head.Valid || head.String == waiter, ahead, nil
}

// attempt takes key if it is free and no other live waiter is queued
// first, or re-enters it for owner; otherwise it queues waiter (when not
// "") and reports the holder's TTL.
func (s *Store) attempt(ctx context.Context, key string, ttl time.Duration, owner, waiter string, queued bool) (grant, error) {
	if s.q.fastAcquire != "" && !queued {
		// One statement takes a free key nobody waits for; the
		// transaction below handles the rest (held, re-entry, a queue).
		tok := token.New()
		var fence int64
		err := s.queryRow(ctx, s.q.fastAcquire, []byte(key), tok, []byte(owner), us(ttl)).Scan(&fence)
		if err == nil {
			return grant{token: tok, fence: fence}, nil
		}
		if !errors.Is(err, sql.ErrNoRows) && !retryable(err) {
			s.unanswered(ctx, err, key, tok)
			return grant{}, s.errWrap("acquire", key, err)
		}
		// (A serialization failure, under a session default of
		// REPEATABLE READ: the transaction below, at READ COMMITTED.)
	}
	if s.q.myAcquire != "" && !queued {
		if g, ok, err := s.myTake(ctx, key, ttl, owner); err != nil || ok {
			return g, err
		}
	}
	if queued && waiter != "" && owner == "" {
		// Woken or looking as the first in line: one statement takes the
		// free key if we are first, and leaves the queue.
		if g, ok, err := s.headAcquire(ctx, key, ttl, waiter); err != nil || ok {
			return g, err
		}
	}
	var g grant
	err := s.inTx(ctx, "acquire", key, func(tx *sql.Tx) error {
		g = grant{}
		r, err := s.q.lockRow(ctx, tx, key, true)
		if err != nil {
			return err
		}
		if r.held() && owner != "" && string(r.owner) == owner { // re-entry: one more hold of the same grant
			g = grant{token: r.token, fence: r.fence}
			return s.setLock(ctx, tx, key, r, r.token, r.owner, r.holds+1, r.fence, max(r.expires, r.now+us(ttl)))
		}
		var head string
		if err := tx.QueryRowContext(ctx, s.q.queueHead, []byte(key), r.now).Scan(&head); err != nil && !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		if r.held() || (head != "" && head != waiter) { // held, or kept for the waiter queued first
			if r.held() {
				g.busy = time.Duration(r.expires-r.now) * time.Microsecond
			}
			g.first = head == waiter || head == ""
			return s.queue(ctx, tx, key, waiter)
		}
		g = grant{token: token.New(), fence: max(r.fence+1, r.now)}
		if err := s.setLock(ctx, tx, key, r, g.token, []byte(owner), 1, g.fence, r.now+us(ttl)); err != nil {
			return err
		}
		if head != "" {
			_, err = tx.ExecContext(ctx, s.q.queueDelete, []byte(key), head)
		}
		return err
	})
	if err != nil && g.token != "" && owner == "" {
		s.unanswered(ctx, err, key, g.token) // (the commit's answer lost)
	}
	return g, err
}

// myTake is MySQL's one statement that takes key if it is free (or
// expired, or never seen) and nobody is queued for it; ok reports whether
// it did.
func (s *Store) myTake(ctx context.Context, key string, ttl time.Duration, owner string) (g grant, ok bool, err error) {
	tok := token.New()
	res, err := s.exec(ctx, s.q.myAcquire, []byte(key), tok, []byte(owner), us(ttl), []byte(key))
	if err != nil && !retryable(err) {
		s.unanswered(ctx, err, key, tok)
		return grant{}, false, s.errWrap("acquire", key, err)
	}
	if fence, ok := myTaken(res, err); ok { // inserted, or taken over
		return grant{token: tok, fence: fence}, true, nil
	}
	return grant{}, false, nil
}

// headAcquire takes key for waiter if it is free and waiter is first in
// its queue; ok reports whether it did.
func (s *Store) headAcquire(ctx context.Context, key string, ttl time.Duration, waiter string) (g grant, ok bool, err error) {
	tok := token.New()
	if s.dialect == Postgres {
		var fence int64
		err := s.queryRow(ctx, s.q.headAcquire, []byte(key), tok, []byte{}, us(ttl), waiter).Scan(&fence)
		switch {
		case errors.Is(err, sql.ErrNoRows), retryable(err): // (not taken: the caller's transaction looks)
			return grant{}, false, nil
		case err != nil:
			s.unanswered(ctx, err, key, tok)
			return grant{}, false, s.errWrap("acquire", key, err)
		}
		return grant{token: tok, fence: fence}, true, nil
	}
	res, err := s.exec(ctx, s.q.headAcquire, tok, []byte{}, us(ttl), []byte(key), []byte(key), waiter)
	if err != nil && !retryable(err) {
		s.unanswered(ctx, err, key, tok)
		return grant{}, false, s.errWrap("acquire", key, err)
	}
	if n, _ := affected(res, err); n != 1 {
		return grant{}, false, nil
	}
	fence, err := res.LastInsertId()
	if err != nil {
		return grant{}, false, s.errWrap("acquire", key, err)
	}
	// The key is ours: leave the queue (else our place keeps the key
	// for us after we release it, until it expires).
	// Best effort: a place left behind expires within the waiter TTL.
	_, _ = s.db.ExecContext(ctx, s.q.queueDelete, []byte(key), waiter)
	return grant{token: tok, fence: fence}, true, nil
}

// affected is the rows a statement affected, 0 after an error.
// myTaken reports whether a MySQL statement that takes a row with
// LAST_INSERT_ID(fence) took it, and the fence: the statements set
// LAST_INSERT_ID(0) when they leave the row as it was. Not the count of
// affected rows, which depends on the connection (clientFoundRows=true
// counts a row the statement found and left as it was).
func myTaken(res sql.Result, err error) (int64, bool) {
	if err != nil {
		return 0, false
	}
	fence, err := res.LastInsertId()
	return fence, err == nil && fence > 0
}

func affected(res sql.Result, err error) (int64, error) {
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// queue puts waiter in key's queue, or renews its place.
func (s *Store) queue(ctx context.Context, tx *sql.Tx, key, waiter string) error {
	if waiter == "" {
		return nil
	}
	if _, err := tx.ExecContext(ctx, s.q.queueUpsert, []byte(key), waiter, us(s.waiterTTL)); err != nil || s.q.queueMark == "" {
		return err
	}
	_, err := tx.ExecContext(ctx, s.q.queueMark, []byte(key))
	return err
}

// queueAlone puts waiter in key's queue, or renews its place, in a
// statement of its own.
func (s *Store) queueAlone(ctx context.Context, key, waiter string) error {
	// (MySQL: the place, then the mark. A take between the two does not
	// see the waiter, as it would not have a moment earlier.)
	if _, err := s.db.ExecContext(ctx, s.q.queueUpsert, []byte(key), waiter, us(s.waiterTTL)); err != nil || s.q.queueMark == "" {
		return err
	}
	_, err := s.db.ExecContext(ctx, s.q.queueMark, []byte(key))
	return err
}

// leaveQueue takes a waiter that gives up out of key's queue, and wakes
// the next: the one leaving may have been first in line for a free key.
func (s *Store) leaveQueue(ctx context.Context, key, waiter string, queued bool) {
	if !queued {
		return
	}
	ctx, cancel := lockdriver.CleanupContext(ctx)
	defer cancel()
	var head string
	// Best effort: a place left behind expires within the waiter TTL.
	err := s.inTx(ctx, "leave queue", key, func(tx *sql.Tx) (err error) {
		if _, err := tx.ExecContext(ctx, s.q.queueDelete, []byte(key), waiter); err != nil {
			return err
		}
		head, err = s.notifyHead(ctx, tx, key)
		return err
	})
	if err == nil {
		s.wakeWaiter(head)
	}
}

// wakeWaiter wakes a lock's waiter if it waits in this process.
func (s *Store) wakeWaiter(waiter string) {
	if waiter != "" {
		locks, _, _ := s.Tables()
		s.hub.wake(locks, waiter)
	}
}

// newLease returns the lease of grant g, taken by owner; p, when not nil,
// is the connection that keeps the key's session lock (see
// acquireQueued), closed if the lease ends without a release. A lease
// without an owner starts a hold its key can be handed on with
// (handoff.go).
func (s *Store) newLease(key string, g grant, deadline time.Time, p *pin, owner string) *lease {
	var h *hold
	if owner == "" && s.handOffs.Max > 0 {
		h = &hold{took: time.Now(), next: g.fence + 1, last: g.fence, deadline: deadline}
		s.gates.hold(key, h)
	}
	return s.makeLease(key, g.token, g.fence, deadline, p, h)
}

// makeLease returns a held lease, h's current one when h is not nil.
func (s *Store) makeLease(key, tok string, fence int64, deadline time.Time, p *pin, h *hold) *lease {
	l := &lease{s: s, key: key, pin: p, hold: h}
	if h != nil {
		h.current = l
	}
	cfg := lockdriver.Config{
		Driver: "sqlstore", Key: key, Token: tok, Fence: uint64(fence), Deadline: deadline, Store: l,
	}
	if p != nil || h != nil {
		// (A lease handed on ends without OnEnd: its pin and hold went
		// on with the next lease.)
		cfg.OnEnd = func(lockdriver.State) {
			if c := p.take(); c != nil {
				discard(c)
			}
			if h != nil {
				s.gates.unhold(key, h)
			}
		}
	}
	l.Init(cfg)
	return l
}

func (l *lease) lost(op string) error {
	return stop(fmt.Errorf("sqlstore: %s %q: %w", op, l.key, lock.ErrLockLost))
}

// StoreRefresh implements lockdriver.Store. An owner's holds share the
// key's expiry: one hold's refresh never shortens what another was
// promised.
func (l *lease) StoreRefresh(ctx context.Context, ttl time.Duration) (time.Time, error) {
	if l.hold != nil {
		return l.s.refreshHold(ctx, l, ttl)
	}
	return l.s.refresh(ctx, l.key, l.Token(), ttl)
}

// refresh extends key's hold by tok to ttl and returns its new deadline.
func (s *Store) refresh(ctx context.Context, key, tok string, ttl time.Duration) (time.Time, error) {
	start := time.Now()
	err := s.inTx(ctx, "refresh", key, func(tx *sql.Tx) error {
		r, err := s.q.lockRow(ctx, tx, key, false)
		if err != nil {
			return err
		}
		if !r.held() || r.token != tok {
			return stop(fmt.Errorf("sqlstore: refresh %q: %w", key, lock.ErrLockLost))
		}
		exp := r.now + us(ttl)
		if r.holds > 1 {
			exp = max(exp, r.expires)
		}
		return s.setLock(ctx, tx, key, r, r.token, r.owner, r.holds, r.fence, exp)
	})
	if err != nil {
		return time.Time{}, err
	}
	return start.Add(ttl), nil
}

// StoreRelease implements lockdriver.Store: it hands the key to the
// Store's next acquisition waiting for it (handoff.go), or gives one hold
// back; the last frees the key and wakes its waiters.
func (l *lease) StoreRelease(ctx context.Context) error {
	s := l.s
	if l.hold != nil {
		if done, err := s.handOff(ctx, l); done {
			return err
		}
	}
	if c := l.pin.take(); c != nil {
		freed, err := s.releasePinned(ctx, l, c)
		if err == nil && freed {
			return nil
		}
		if err != nil && !retryable(err) && !lockTimedOut(err) {
			return s.errWrap("release", l.key, err)
		}
		// More holds, or not ours: the statements below tell which.
	}
	var head string
	if s.q.releaseNotify != "" {
		locks, _, _ := s.Tables()
		var n int
		var waiter sql.NullString
		err := s.queryRow(ctx, s.q.releaseNotify, []byte(l.key), l.Token(), locks).Scan(&n, &waiter, new(sql.NullString))
		if err != nil && !retryable(err) {
			return s.errWrap("release", l.key, err)
		}
		if n == 1 {
			s.wakeWaiter(waiter.String)
			return nil
		}
		// Not ours, or the row changed meanwhile: the statements below.
	}
	if s.q.fastRelease != "" {
		res, err := s.db.ExecContext(ctx, s.q.fastRelease, []byte(l.key), l.Token())
		if err != nil && !retryable(err) {
			return s.errWrap("release", l.key, err)
		}
		if n, _ := affected(res, err); n == 1 {
			locks, _, _ := s.Tables()
			// Best effort: a waiter not woken looks again within a second.
			if err := s.queryRow(ctx, s.q.notifyHead, locks, []byte(l.key)).Scan(&head, new(string)); err == nil {
				s.wakeWaiter(head)
			}
			return nil
		}
	}
	if s.q.myRelease != "" {
		res, err := s.exec(ctx, s.q.myRelease, []byte(l.key), l.Token())
		if err != nil && !retryable(err) {
			return s.errWrap("release", l.key, err)
		}
		if n, _ := affected(res, err); n == 1 {
			return nil // waiters poll (no notifications on MySQL)
		}
	}
	err := s.inTx(ctx, "release", l.key, func(tx *sql.Tx) (err error) {
		r, err := s.q.lockRow(ctx, tx, l.key, false)
		if err != nil {
			return err
		}
		if !r.held() || r.token != l.Token() {
			return l.lost("release")
		}
		if r.holds > 1 {
			return s.setLock(ctx, tx, l.key, r, r.token, r.owner, r.holds-1, r.fence, r.expires)
		}
		head, err = s.freeLock(ctx, tx, l.key, r)
		return err
	})
	if err == nil {
		s.wakeWaiter(head)
	}
	return err
}

// setLock writes key's row, which tx has locked and read as r: the update
// names the row by its key, token and fence as read, and fails if it
// matched nothing (on PostgreSQL; MySQL's count of affected rows depends
// on the connection's settings).
func (s *Store) setLock(ctx context.Context, tx *sql.Tx, key string, r lockRow, tok string, owner []byte, holds int, fence, expires int64) error {
	res, err := tx.ExecContext(ctx, s.q.lockUpdate, tok, owner, holds, fence, expires, []byte(key), r.token, r.fence)
	return s.matchedOne(res, err, "lock", key)
}

// matchedOne checks that an update of a row its transaction had locked
// and read matched it.
func (s *Store) matchedOne(res sql.Result, err error, what, key string) error {
	if err != nil || s.dialect != Postgres {
		return err
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		return stop(fmt.Errorf("sqlstore: the %s row of %q changed under its row lock (%d rows matched, %v): is another program writing oncekit's tables?", what, key, n, err))
	}
	return nil
}

// freeLock frees a key whose row tx holds: the row stays, free and
// keeping its fence, for the cleanup (see cleanupGrace). It notifies the
// first waiter and returns it, for the caller to wake in this process once
// tx has committed.
func (s *Store) freeLock(ctx context.Context, tx *sql.Tx, key string, r lockRow) (string, error) {
	if err := s.setLock(ctx, tx, key, r, "", []byte{}, 0, r.fence, r.now); err != nil {
		return "", err
	}
	return s.notifyHead(ctx, tx, key)
}

var (
	_ lock.Locker      = (*Store)(nil)
	_ lockdriver.Store = (*lease)(nil)
)
