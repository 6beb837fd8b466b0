package sqlstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/lock/lockdriver"
	"github.com/oncekit/oncekit/storage/internal/token"
)

// The server's queue. On a database session of its own (the default on
// PostgreSQL, unless notify=false), a lock is two things: its row, which
// alone decides who holds the key (token, fence, expiry by the server's
// clock, as everywhere in this driver), and a session lock on the key
// (pg_advisory_lock of a 64-bit hash of the table and the key) that the
// holder's connection keeps while it holds the row. A waiter asks for the
// session lock with a timeout and the row in one statement: the server
// queues the waiters, in order, and a release — the row freed and the
// session lock given back, one statement — lets the next waiter's
// statement go on and take the row, without a notification or a second
// round trip. The session lock is only the queue, never the truth:
//
//   - a waiter's wait is bounded by the holder's expiry (lock_timeout), and
//     a row that is free or expired when the wait ends is taken without the
//     session lock, so a holder that stopped (a paused process whose
//     connection lives on) delays the queue by its TTL at most, as a
//     crashed one does (its connection's end gives the session lock back);
//   - a lease that ends without a release (its deadline passed, its key
//     was lost) closes its connection, which frees the session lock;
//   - the row's fence, expiry and token are checked and written exactly as
//     without the queue, so a second holder is impossible whatever the
//     session locks say.
//
// The cost is one connection per held lock and per waiter, taken from the
// Store's pool for the lock's life, as pg_advisory_lock takes one.

// sessionID is the key's session lock: a 64-bit hash of the locks table
// and the key (another application's advisory locks would have to collide
// with it by chance; a collision only makes a waiter wait for the other
// lock as long as the holder's TTL, never lets two holders in).
func (s *Store) sessionID(key string) int64 {
	locks, _, _ := s.Tables()
	h := fnv.New64a()
	h.Write([]byte(locks))
	h.Write([]byte{0})
	h.Write([]byte(key))
	return int64(h.Sum64())
}

// sessionName is the key's session lock as the statements name it: on
// PostgreSQL the advisory lock's 64-bit number, on MySQL GET_LOCK's name
// (at most 64 characters).
func (s *Store) sessionName(key string) any {
	if s.dialect == MySQL {
		return fmt.Sprintf("oncekit:%016x", uint64(s.sessionID(key)))
	}
	return s.sessionID(key)
}

// pin is the connection of a held lease that keeps the key's session
// lock, until the lease is released (the release gives the lock back on
// it) or ends otherwise (the connection is closed).
type pin struct {
	mu   sync.Mutex
	conn *sql.Conn
	s    *Store // whose slot conn holds
}

// take returns the pinned connection, once; nil when there is none left.
func (p *pin) take() *sql.Conn {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	c := p.conn
	if c != nil {
		p.s.freeSlot() // (c is closed or handed back at once)
	}
	p.conn = nil
	return c
}

// takeSlot reserves one of the pool's connections for a lock's wait and
// hold, and reports whether it could: at most half of a bounded pool is
// kept by waiters and holders, so that the holders' own statements always
// find a connection. Without a slot, an acquisition queues in the waiters
// table instead (and its holder keeps no connection).
func (s *Store) takeSlot() bool {
	if s.slots == nil {
		return true
	}
	select {
	case s.slots <- struct{}{}:
		return true
	default:
		return false
	}
}

func (s *Store) freeSlot() {
	if s.slots != nil {
		<-s.slots
	}
}

// discard closes c for good rather than hand it back to the pool: its
// session may hold a session lock.
func discard(c *sql.Conn) {
	_ = c.Raw(func(any) error { return driver.ErrBadConn })
	_ = c.Close()
}

// connRow runs a one-row statement on c and scans it: on pgx through the
// pgx connection itself (see queryRow).
func (s *Store) connRow(ctx context.Context, c *sql.Conn, query string, args []any, dest ...any) error {
	if !s.pgx {
		return c.QueryRowContext(ctx, query, args...).Scan(dest...)
	}
	native := true
	err := c.Raw(func(dc any) error {
		pc, ok := dc.(*stdlib.Conn)
		if !ok {
			native = false // (c is busy inside Raw: asked below)
			return nil
		}
		return pc.Conn().QueryRow(ctx, query, args...).Scan(dest...)
	})
	if !native {
		return c.QueryRowContext(ctx, query, args...).Scan(dest...)
	}
	return err
}

// lockTimedOut reports the server's end of a session-lock wait that ran
// out (PostgreSQL lock_not_available): the lock was not taken.
func lockTimedOut(err error) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg) && pg.Code == "55P03" || errors.Is(err, errWaitEnded)
}

// errWaitEnded is MySQL's GET_LOCK answering 0: the wait ran out.
var errWaitEnded = errors.New("sqlstore: session lock wait ended")

// queueStep is how long a waiter that holds the session lock, but finds
// the row still held by a holder without it, sleeps between two looks.
func (s *Store) queueStep() time.Duration { return max(s.pollInterval/10, time.Millisecond) }

// waitBudget is how long a waiter asks the server to queue it for the
// session lock: until the holder's expiry, or, when the row was free at
// the last look, until it has been free for stuckAfter (the session lock
// is then passing to the next waiter, who takes the row within
// microseconds); and never closer to ctx's deadline than deadlineMargin.
// It is not positive when the deadline is too near to start a wait.
func (s *Store) waitBudget(ctx context.Context, left time.Duration) time.Duration {
	d := left + 2*time.Millisecond
	if left <= 0 {
		d = s.stuckAfter() + left + time.Millisecond
	}
	d = max(d, time.Millisecond)
	if dl, ok := ctx.Deadline(); ok {
		d = min(d, time.Until(dl)-deadlineMargin)
	}
	return d
}

// deadlineMargin is how long before the caller's deadline the server's
// wait for a key ends. A wait the server outlived its caller by — its
// answer lost to the deadline, the cancel request slow on a loaded
// machine — would take the key at the holder's release and keep it, for
// nobody, until the background undo ran; ending the server's wait first
// means a caller that gave up has no statement left that can take the
// key.
const deadlineMargin = 15 * time.Millisecond

// waitOrTimeOut queues q for budget, or, when budget is not positive (the
// deadline too near to start a wait), waits for ctx's end without a
// statement, the key not taken (awaitRow then answers the deadline).
func (q *queuer) waitOrTimeOut(ctx context.Context, budget time.Duration) error {
	if budget <= 0 {
		<-ctx.Done()
		return nil
	}
	return q.queue(ctx, budget)
}

// stuckAfter is how long a row must have been free or expired while its
// key's session lock stays taken before an acquirer takes the row without
// the session lock: its holder stopped (a paused process whose connection
// lives on), or ForceRelease freed the row.
func (s *Store) stuckAfter() time.Duration { return s.waiterTTL / 3 }

// hotKeys remembers keys a Store found taken lately, by their session
// lock's number, in 256 slots: a key's slot by its number, a later key
// overwriting an earlier one of the same slot. An acquisition of a key
// remembered queues at once; of any other, it first tries without
// waiting. A key forgotten costs its next acquisition one statement more;
// one remembered wrongly, a lock_timeout set.
type hotKeys [256]atomic.Int64

func (h *hotKeys) mark(id int64)     { h[uint64(id)%uint64(len(h))].Store(id) }
func (h *hotKeys) has(id int64) bool { return h[uint64(id)%uint64(len(h))].Load() == id }

// look is one statement's answer about a key.
type look struct {
	taken   bool          // the row is ours now (fence)
	fence   int64         //
	holding bool          // we hold the session lock (taken, or first in line)
	left    time.Duration // when not taken: the holder's TTL; ≤ 0: free or expired for -left (never seen: a very long time)
	waited  time.Duration // when taken: how long the statement was queued first, by the server's clock
	queued  bool          // when taken: the statement was queued for a time it did not tell (MySQL)
	unknown bool          // not taken, and left is not known: the row is to be looked at at once
	existed bool          // MySQL: a plain insert found the key's row there
}

// tryLook takes the session lock and the row if both are free; it keeps
// neither otherwise.
func (s *Store) tryLook(ctx context.Context, c *sql.Conn, key, tok, owner string, ttl time.Duration, fresh bool) (look, error) {
	if s.dialect == MySQL {
		return s.myTryLook(ctx, c, key, tok, owner, ttl, fresh)
	}
	var fence, waited int64
	var got bool
	err := s.connRow(ctx, c, s.q.sqTry, []any{[]byte(key), tok, []byte(owner), us(ttl), s.sessionName(key)}, &fence, &got, &waited)
	switch {
	case err == nil:
		return look{taken: true, fence: fence, holding: got, waited: max(time.Duration(waited)*time.Microsecond, 0)}, nil
	case !errors.Is(err, sql.ErrNoRows):
		return look{}, err
	}
	var remaining sql.NullInt64
	var queued bool
	if err := s.connRow(ctx, c, s.q.sqLeft, []any{[]byte(key)}, &remaining, &queued); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return look{}, err
	}
	if l := leftDur(remaining); l > 0 || !queued {
		return look{left: l}, nil
	}
	// Free, but waiters may be queued in the waiters table: the statement
	// that looks there (and clears the flag when nobody waits).
	err = s.connRow(ctx, c, s.q.sqTryFull, []any{[]byte(key), tok, []byte(owner), us(ttl), s.sessionName(key)}, &fence, &got, &waited)
	switch {
	case err == nil:
		return look{taken: true, fence: fence, holding: got, waited: max(time.Duration(waited)*time.Microsecond, 0)}, nil
	case !errors.Is(err, sql.ErrNoRows):
		return look{}, err
	}
	return look{left: leftDur(remaining)}, nil // (kept for a queued waiter)
}

// waitLook queues for the session lock for at most budget and then takes
// the row if it is free; once the lock is ours, it stays ours. The
// server's wait ends by lock_timeout, or by a cancel request when ctx ends
// first; tainted reports that one was sent (it may yet reach c's session
// and cancel a later statement: c must go).
func (s *Store) waitLook(ctx context.Context, c *sql.Conn, key, tok, owner string, ttl, budget time.Duration) (l look, tainted bool, err error) {
	if s.dialect == MySQL {
		l, err = s.myWaitLook(ctx, c, key, tok, owner, ttl, budget)
		return l, errors.Is(err, errConnKilled), err
	}
	var fence, waited sql.NullInt64
	timeout := strconv.FormatInt(max(budget.Milliseconds(), 1), 10) + "ms"
	args := []any{[]byte(key), tok, []byte(owner), us(ttl), s.sessionName(key), timeout}
	dest := []any{&fence, &waited}
	native := s.pgx
	if native {
		err = c.Raw(func(dc any) error {
			pc, ok := dc.(*stdlib.Conn)
			if !ok {
				native = false // (c is busy inside Raw: asked below)
				return nil
			}
			// Not ctx itself: pgx would close the connection when it
			// ends, and the server, which learns of that only when it
			// next writes to it, would go on waiting and take the row for
			// nobody. A cancel request ends the statement instead; the
			// server's lock_timeout bounds it, and a deadline a little
			// past that bounds a connection that stopped answering.
			wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), budget+lockdriver.ReleaseTimeout)
			defer cancel()
			stop := context.AfterFunc(ctx, func() {
				cctx, cancel := lockdriver.CleanupContext(context.Background())
				defer cancel()
				_ = pc.Conn().PgConn().CancelRequest(cctx)
			})
			err := pc.Conn().QueryRow(wctx, s.q.sqWait, args...).Scan(dest...)
			tainted = !stop()
			return err
		})
	}
	if !native {
		err = c.QueryRowContext(ctx, s.q.sqWait, args...).Scan(dest...)
	}
	switch {
	case errors.Is(err, sql.ErrNoRows): // the session lock is ours, the row is not free
		return look{holding: true, unknown: true}, tainted, nil
	case err != nil:
		return look{}, tainted, err
	}
	return look{taken: true, fence: fence.Int64, holding: true, waited: usDur(waited)}, tainted, nil
}

// takeLook takes the row if it is free (the session lock as it is).
func (s *Store) takeLook(ctx context.Context, c *sql.Conn, key, tok, owner string, ttl time.Duration) (look, error) {
	if s.dialect == MySQL {
		return s.myTakeLook(ctx, c, key, tok, owner, ttl)
	}
	var fence, remaining, waited sql.NullInt64
	err := s.connRow(ctx, c, s.q.sqTake, []any{[]byte(key), tok, []byte(owner), us(ttl)}, &fence, &remaining, &waited)
	if err != nil {
		return look{}, err
	}
	return look{taken: fence.Valid, fence: fence.Int64, left: leftDur(remaining), waited: usDur(waited)}, nil
}

// leftDur is a row's expiry less the server's clock: how long its holder
// has left, or (≤ 0) how long ago it was freed or expired; a key never
// seen reads as freed long ago.
func leftDur(v sql.NullInt64) time.Duration {
	if !v.Valid {
		return math.MinInt64 / 2
	}
	return time.Duration(v.Int64) * time.Microsecond
}

func usDur(v sql.NullInt64) time.Duration {
	if !v.Valid || v.Int64 <= 0 {
		return 0
	}
	return time.Duration(v.Int64) * time.Microsecond
}

// queuer is one acquisition through the server's queue.
type queuer struct {
	s        *Store
	key, tok string
	owner    string
	ttl      time.Duration
	c        *sql.Conn // nil while none is open
	holding  bool      // c's session holds the key's session lock
	tainted  bool      // a cancel request may still reach c's session
	fresh    bool      // the key was not found taken or there lately (hotKeys)
	l        look      // the answer of the last statement
	start    time.Time // when the last statement was sent
}

// done gives c back: to the pool, after giving back the session lock it
// holds; closed when that is not safe.
func (q *queuer) done(ctx context.Context) {
	switch {
	case q.c == nil:
	case q.tainted:
		discard(q.c)
	case q.holding:
		q.s.unlockSession(ctx, q.c, q.key)
	default:
		_ = q.c.Close()
	}
	q.c, q.holding, q.tainted = nil, false, false
}

// drop closes c after a failed statement, which may have left the
// session lock taken.
func (q *queuer) drop() {
	if q.c != nil {
		discard(q.c)
	}
	q.c, q.holding, q.tainted = nil, false, false
}

// queue waits for the session lock for at most budget, then takes the row
// if it is free.
func (q *queuer) queue(ctx context.Context, budget time.Duration) error {
	q.start = time.Now()
	l, tainted, err := q.s.waitLook(ctx, q.c, q.key, q.tok, q.owner, q.ttl, budget)
	q.tainted = q.tainted || tainted
	switch {
	case errors.Is(err, errWaitEnded): // (MySQL: GET_LOCK said no)
		l = look{left: math.MinInt64 / 2} // (the row is looked at next)
	case err != nil && !q.tainted && (lockTimedOut(err) || retryable(err)):
		// The wait ran out — lock_timeout bounds each of the statement's
		// waits: the session lock's, and, once that was granted, the
		// row's (a release or a take still committing) — or the row's
		// update failed (a serialization failure under a session default
		// of REPEATABLE READ, a deadlock). The session lock outlives the
		// failed statement: whether it was taken is asked, not guessed,
		// or a second wait would take it again (it counts holds), the
		// release give one back, and the connection go back to the pool
		// holding it, for every later acquirer to queue behind.
		if l, err = q.s.sessionLook(ctx, q.c, q.key); err != nil {
			return err
		}
	case err != nil:
		return err
	}
	q.l, q.holding = l, q.holding || l.holding
	return nil
}

// sessionLook says whether c's session holds key's session lock, and the
// row's expiry; a look at the row is due next when it does not.
func (s *Store) sessionLook(ctx context.Context, c *sql.Conn, key string) (look, error) {
	var held, remaining sql.NullInt64
	if err := s.connRow(ctx, c, s.q.sqHeld, []any{s.sessionName(key), []byte(key)}, &held, &remaining); err != nil {
		return look{}, err
	}
	if held.Int64 != 1 {
		return look{left: math.MinInt64 / 2}, nil
	}
	return look{holding: true, left: leftDur(remaining)}, nil
}

// take takes the row if it is free, the session lock as it is.
func (q *queuer) take(ctx context.Context) error {
	q.start = time.Now()
	l, err := q.s.takeLook(ctx, q.c, q.key, q.tok, q.owner, q.ttl)
	switch {
	case err != nil && retryable(err):
		q.l = look{}
	case err != nil:
		return err
	default:
		q.l = l
	}
	return nil
}

// try takes the session lock and the row if both are free.
func (q *queuer) try(ctx context.Context) error {
	q.start = time.Now()
	l, err := q.s.tryLook(ctx, q.c, q.key, q.tok, q.owner, q.ttl, q.fresh)
	switch {
	case err != nil && retryable(err):
		if l, err = q.s.sessionLook(ctx, q.c, q.key); err != nil { // (as in queue)
			return err
		}
	case err != nil:
		return err
	}
	q.l, q.holding = l, q.holding || l.holding
	return nil
}

// acquireQueued is TryAcquire (wait false) and Acquire through the
// server's queue.
func (s *Store) acquireQueued(ctx context.Context, key string, ttl time.Duration, owner string, wait bool) (lock.Lease, error) {
	op := "try acquire"
	if wait {
		op = "acquire"
	}
	pinned := false // the slot (takeSlot, by the caller) went to the lease's pin
	defer func() {
		if !pinned {
			s.freeSlot()
		}
	}()
	if owner != "" { // an owner re-enters a key it holds at once
		start := time.Now()
		if g, ok, err := s.reenter(ctx, key, ttl, owner); err != nil || ok {
			if err != nil {
				return nil, s.acquireErr(ctx, err)
			}
			return s.newLease(key, g, start.Add(ttl), nil, owner).Lease(), nil
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(s.sctx, cancel)() // Close ends the wait
	failed := func(err error) error {
		if s.closed() {
			return s.closedErr(op, key)
		}
		return s.acquireErr(ctx, s.errWrap(op, key, err))
	}
	began := time.Now()
	c, err := s.db.Conn(ctx)
	if err != nil {
		return nil, failed(err)
	}
	q := &queuer{s: s, key: key, tok: token.New(), owner: owner, ttl: ttl, c: c}
	defer q.done(ctx)
	id := s.sessionID(key)
	q.fresh = !s.hot.has(id)
	switch budget := s.waitBudget(ctx, min(ttl, s.stuckAfter())); {
	case wait && !q.fresh && budget > 0:
		// A key this Store found taken lately: queued at once (a free key
		// is taken by the same statement), for a second at most before the
		// row's expiry is known.
		err = q.queue(ctx, budget)
	default:
		// Any other key is most likely free: a statement that does not
		// wait (nor set lock_timeout) takes it; a taken one is marked.
		err = q.try(ctx)
		if err == nil && (!q.l.taken || q.l.existed) {
			s.hot.mark(id)
		}
	}
	var lost error // what the database said last while it did not answer
	if err != nil {
		q.drop()
		if s.unanswered(ctx, err, key, q.tok) {
			q.tok = token.New() // (an attempt again takes the row anew)
		}
		// A wait the database dropped mid-way (it crashed, or restarted)
		// is asked again below; a statement it never got fails now.
		if !wait || !connectionLost(err) || pgconn.SafeToRetry(err) || ctx.Err() != nil || s.closed() {
			return nil, failed(err)
		}
		lost = err
	}
	n, err := s.awaitRow(ctx, q, wait, op, lost, failed)
	if err != nil {
		return nil, err
	}
	if ctx.Err() != nil {
		// Taken as the caller gave up (a cancel request came too late):
		// given back.
		q.drop()
		s.releaseRow(key, q.tok)
		return nil, lockdriver.NotAcquired(ctx)
	}
	l, pin := s.queuedLease(ctx, q, began, n)
	pinned = pin
	return l, nil
}

// queuedLease is the lease of the row q took after n rounds (began: when
// the acquisition began): a hand-off is reported when it waited, and the
// session lock's connection pins the lease while it holds it (pinned:
// the caller's slot went with it).
func (s *Store) queuedLease(ctx context.Context, q *queuer, began time.Time, n int) (l lock.Lease, pinned bool) {
	// A hand-off: the key was taken after a wait, in the server's queue
	// (a millisecond or more by its clock; on MySQL, which does not say,
	// by ours) or here.
	if n > 0 || q.l.waited >= time.Millisecond || q.l.queued && time.Since(q.start) >= time.Millisecond {
		s.handedOff(ctx, q.key, q.l.fence, began)
	}
	var p *pin
	switch {
	case q.tainted:
		q.drop() // (the key is ours; its session lock went with c)
	case q.holding:
		p = &pin{conn: q.c, s: s}
		q.c, pinned = nil, true
	}
	// The row's expiry is the server's clock when it took the row plus
	// ttl: counted here from before the statement was sent, plus how long
	// the server queued it first (by the server's clock, from when it got
	// the statement), which is never more than the time that passed here.
	deadline := q.start.Add(q.l.waited + q.ttl)
	if q.l.queued && time.Since(q.start) > q.ttl/4 {
		// MySQL does not say how long it queued the statement: after a
		// long wait, the hold is extended, counted from now. (If that
		// fails, the lease keeps the deadline counted from before the
		// wait, which is never late.)
		if d, err := s.refresh(ctx, q.key, q.tok, q.ttl); err == nil {
			deadline = d
		}
	}
	return s.newLease(q.key, grant{token: q.tok, fence: q.l.fence}, deadline, p, q.owner).Lease(), pinned
}

// awaitRow runs the rounds of an acquisition whose first attempt did not
// take key's row (q), until it does: queued on the session lock, looking
// at the row when its holder seems gone, asking again after the database
// stopped answering (lost is what it said last). It returns how many
// rounds it took.
func (s *Store) awaitRow(ctx context.Context, q *queuer, wait bool, op string, lost error, failed func(error) error) (n int, err error) {
	rowLooked := false   // the row was looked at since the last wait
	var faulty time.Time // when the database stopped answering, zero while it answers
	for ; !q.l.taken; n++ {
		// The session lock is taken but the row has been free or expired
		// for a while: its holder stopped without giving it back (or
		// ForceRelease freed the row). The row decides.
		stuck := q.c != nil && !q.holding && q.l.left <= -s.stuckAfter() && !rowLooked
		if !wait && !stuck {
			return n, &lock.BusyError{Key: q.key, TTL: max(q.l.left, 0)}
		}
		if err := s.closedErr(op, q.key); err != nil {
			return n, err
		}
		if ctx.Err() != nil {
			return n, lockdriver.NotAcquired(ctx)
		}
		if q.c == nil {
			// The database stopped answering while we waited: a waiter
			// asks again, until waiterTTL has passed without an answer,
			// rather than fail and have its retry queue last.
			if faulty.IsZero() {
				faulty = time.Now()
			}
			if time.Since(faulty) > s.waiterTTL {
				return n, failed(lost)
			}
			if !sleepCtx(ctx, faultPause(time.Since(faulty))) {
				continue
			}
			if q.c, err = s.db.Conn(ctx); err != nil {
				q.c = nil
				continue
			}
			q.l, rowLooked = look{}, false
			err = q.waitOrTimeOut(ctx, s.waitBudget(ctx, s.stuckAfter()))
		} else if stuck {
			err, rowLooked = q.take(ctx), true
		} else if q.holding {
			// First in line, but the row is held by a holder without the
			// session lock (it took the key over by expiry, or while this
			// waiter was granted the lock; or the database restarted), or
			// waiters queue in the waiters table: look again.
			if !q.l.unknown && !sleepCtx(ctx, min(s.queueStep(), max(q.l.left, time.Millisecond))) {
				continue
			}
			err = q.take(ctx)
		} else {
			err, rowLooked = q.waitOrTimeOut(ctx, s.waitBudget(ctx, q.l.left)), false
		}
		if err != nil {
			q.drop()
			if s.unanswered(ctx, err, q.key, q.tok) {
				q.tok = token.New()
			}
			if wait && connectionLost(err) && ctx.Err() == nil && !s.closed() {
				lost = err
				continue
			}
			return n, failed(err)
		}
		faulty = time.Time{}
	}
	return n, nil
}

// releaseRow frees key's row for token, best effort (the row expires by
// its TTL otherwise), and reports whether it did.
func (s *Store) releaseRow(key, tok string) bool {
	ctx, cancel := lockdriver.CleanupContext(context.Background())
	defer cancel()
	release := s.q.fastRelease
	if release == "" {
		release = s.q.myRelease
	}
	res, err := s.exec(ctx, release, []byte(key), tok)
	n, _ := affected(res, err)
	return n == 1
}

// unanswered frees key's row in the background (undoUnanswered) if a
// statement that may have taken it for tok got no answer (err: ctx ended
// while it ran, or the connection failed after sending it). Otherwise the
// key would stay held by nobody for its TTL, and a waiter that asks again
// with tok would wait for itself. It reports whether it did so: tok must
// then not be used again (a later take with it could be freed by this).
func (s *Store) unanswered(ctx context.Context, err error, key, tok string) bool {
	if ctx.Err() == nil && !connectionLost(err) {
		return false
	}
	s.undoUnanswered(func() bool { return s.releaseRow(key, tok) })
	return true
}

// undoUnanswered runs undo in the background for a statement whose
// answer was lost — now, and again shortly after for one still running on
// the server (a closed connection does not stop it) — until undo reports
// that it undid it, or the Store closes.
func (s *Store) undoUnanswered(undo func() bool) {
	done, ok := s.holdOpen()
	if !ok {
		return
	}
	go func() {
		defer done()
		for _, wait := range []time.Duration{0, 100 * time.Millisecond, time.Second, 5 * time.Second} {
			select {
			case <-time.After(wait):
			case <-s.sctx.Done():
				return
			}
			if undo() {
				return
			}
		}
	}()
}

// acquireErr is err, or lock.ErrNotAcquired when ctx ended.
func (s *Store) acquireErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return lockdriver.NotAcquired(ctx, err)
	}
	return err
}

// unlockSession gives back the session lock c's session holds for key and
// hands c back to the pool; c is closed instead when that fails.
func (s *Store) unlockSession(ctx context.Context, c *sql.Conn, key string) {
	ctx, cancel := lockdriver.CleanupContext(ctx)
	defer cancel()
	var ok sql.NullBool
	if err := s.connRow(ctx, c, s.q.sqUnlock, []any{s.sessionName(key)}, &ok); err != nil || !ok.Bool {
		discard(c)
		return
	}
	_ = c.Close()
}

// reenter takes one more hold of key for owner when owner holds it.
func (s *Store) reenter(ctx context.Context, key string, ttl time.Duration, owner string) (g grant, ok bool, err error) {
	err = s.inTx(ctx, "acquire", key, func(tx *sql.Tx) error {
		r, err := s.q.lockRow(ctx, tx, key, false)
		if err != nil || !r.held() || string(r.owner) != owner {
			return err
		}
		g, ok = grant{token: r.token, fence: r.fence}, true
		return s.setLock(ctx, tx, key, r, r.token, r.owner, r.holds+1, r.fence, max(r.expires, r.now+us(ttl)))
	})
	return g, ok, err
}

// releasePinned frees the last hold of l's key and gives its session lock
// back, in one statement on the pinned connection c; freed reports whether
// it freed the row (false: more holds, or the key is no longer ours).
func (s *Store) releasePinned(ctx context.Context, l *lease, c *sql.Conn) (freed bool, err error) {
	if s.dialect == MySQL {
		return s.myReleasePinned(ctx, l, c)
	}
	var unlocked, queued bool
	err = s.connRow(ctx, c, s.q.sqRelease, []any{[]byte(l.key), l.Token(), s.sessionName(l.key)}, &unlocked, &queued)
	if errors.Is(err, sql.ErrNoRows) {
		// Not freed (more holds, or the key is no longer ours): the
		// session lock goes with the connection.
		discard(c)
		return false, nil
	}
	if err != nil {
		discard(c)
		return false, err
	}
	if unlocked {
		_ = c.Close()
	} else {
		discard(c)
	}
	if queued {
		// A waiter queued in the waiters table (one that found no slot):
		// notified as a release without the server's queue would.
		// Best effort: a waiter not woken looks again within a second.
		var head string
		locks, _, _ := s.Tables()
		if err := s.queryRow(ctx, s.q.notifyHead, locks, []byte(l.key)).Scan(&head, new(string)); err == nil {
			s.wakeWaiter(head)
		}
	}
	return true, nil
}

// sessionWaiters counts the sessions queued for key's session lock.
func (s *Store) sessionWaiters(ctx context.Context, key string) (int, error) {
	var n int
	if s.q.sqWaiting == "" {
		return 0, nil
	}
	err := s.queryRow(ctx, s.q.sqWaiting, s.sessionName(key)).Scan(&n)
	return n, err
}

// sessionQueries are the statements of the server's queue
// (PostgreSQL), set in q.
func sessionQueries(q *queries, locks, waiters, now string) {
	// The row taken when it is free or expired. The common statements
	// (lean) check the row's queued flag instead of the waiters table: a
	// waiter that queues in the table sets it (queueUpsert), and a key
	// whose flag is set is taken by sqTake, which looks in the table and
	// clears the flag when nobody waits there. A statement that names
	// another table pays for it on every run, in the executor's set-up,
	// even when it never reads it: on a new key, a sixth of the cycle.
	//
	// The clock of a row that exists is read once its row lock is ours
	// (in DO UPDATE), not before: a statement that waited for the lock (a
	// release, or any transaction, still committing) takes the row for
	// its TTL from then, and answers how long it waited (RETURNING
	// waited) for the lease's deadline.
	take := func(from string, lean bool) string {
		s := "INSERT INTO " + locks + " AS l (lock_key, token, owner, holds, fence, expires_us)" +
			" SELECT $1, $2, $3, 1, n.now, n.now + $4 FROM " + from +
			" ON CONFLICT (lock_key) DO UPDATE SET token = EXCLUDED.token, owner = EXCLUDED.owner, holds = 1," +
			" fence = GREATEST(l.fence + 1, " + now + "), expires_us = " + now + " + $4"
		if lean {
			return s + " WHERE (l.token = '' OR l.expires_us <= " + now + ") AND NOT l.queued"
		}
		return s + ", queued = false WHERE (l.token = '' OR l.expires_us <= " + now + ")" +
			" AND NOT EXISTS (SELECT 1 FROM " + waiters + " w WHERE w.lock_key = l.lock_key AND w.expires_us > " + now + ")"
	}
	waited := "expires_us - $4 - CAST(EXTRACT(EPOCH FROM statement_timestamp()) * 1000000 AS BIGINT)"
	remaining := "(SELECT expires_us - " + now + " FROM " + locks + " WHERE lock_key = $1)"
	// The row if it is free, then the session lock if it is free: a row
	// taken is answered with whether the session lock came with it (a
	// waiter the server already granted it keeps it, and takes the row
	// after this holder); a row not taken, with nothing (sqLeft asks
	// why), and no session lock was asked for.
	q.sqTry = take("(SELECT "+now+" AS now) n", true) + " RETURNING fence, pg_try_advisory_lock($5), " + waited
	q.sqTryFull = take("(SELECT "+now+" AS now) n", false) + " RETURNING fence, pg_try_advisory_lock($5), " + waited
	// Queued by the server for the session lock, for at most $6 (the
	// lock_timeout, set for the statement's transaction before the wait);
	// the clock is read once the lock is ours, and the row taken if free
	// (ON CONFLICT reads the row's latest version, not the statement's
	// snapshot: a release that committed while we waited is seen). The
	// answer: the fence and how long the server queued the statement; no
	// row when the session lock is ours but the row was not taken.
	q.sqWait = take("(SELECT "+now+" AS now FROM (SELECT pg_advisory_lock($5) FROM"+
		" (SELECT set_config('lock_timeout', $6, true) OFFSET 0) c OFFSET 0) a) n", true) +
		" RETURNING fence, " + waited
	q.sqTake = "WITH t AS (" + take("(SELECT "+now+" AS now) n", false) + " RETURNING fence, " + waited + " AS waited)" +
		" SELECT (SELECT fence FROM t), " + remaining + ", (SELECT waited FROM t)"
	q.sqLeft = "SELECT expires_us - " + now + ", queued FROM " + locks + " WHERE lock_key = $1"
	// The row freed, then the session lock given back (in RETURNING: after
	// the row's update, before the commit): the next waiter's statement
	// goes on, and its ON CONFLICT waits for this one to commit and reads
	// the free row. The answer says whether table waiters may be queued
	// (they are then notified by a statement of its own); no row when the
	// row was not ours to free (the session lock is still held).
	q.sqRelease = "UPDATE " + locks + " SET token = '', owner = ''::bytea, holds = 0, expires_us = " + now +
		" WHERE lock_key = $1 AND token = $2 AND holds = 1 AND expires_us > " + now +
		" RETURNING pg_advisory_unlock($3), queued"
	q.sqUnlock = "SELECT pg_advisory_unlock($1)"
	q.sqHeld = "SELECT CASE WHEN EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted" +
		" AND classid = (($1::bigint >> 32) & 4294967295)::oid AND objid = ($1::bigint & 4294967295)::oid AND objsubid = 1) THEN 1 ELSE 0 END, " +
		strings.Replace(remaining, "$1", "$2", 1)
	q.sqWaiting = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted" +
		" AND database = (SELECT oid FROM pg_database WHERE datname = current_database())" +
		" AND classid = (($1::bigint >> 32) & 4294967295)::oid AND objid = ($1::bigint & 4294967295)::oid AND objsubid = 1"
}

// MySQL's queue: GET_LOCK(name, timeout), in the statement that takes the
// row, as on PostgreSQL. go-sql-driver ends a statement whose context
// ends by closing its connection; MariaDB ends a GET_LOCK wait whose
// connection closed, so a caller that gives up leaves nothing taken. (A
// server that noticed only when it answers would take the row for
// nobody, to expire by its TTL.)
