package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/lock/lockdriver"
	"github.com/oncekit/oncekit/storage/internal/token"
)

// An idempotency record is one row of the records table: free (a
// tombstone keeping the fence of an abandoned claim), in flight (a claim:
// its token, fingerprint and lease), or completed (the stored result and
// its retention). Like a lock's, every change locks the row first, and a
// row is deleted only once the server's clock has passed its fence.
const (
	stateFree      = 0
	stateInFlight  = 1
	stateCompleted = 2
)

type recordRow struct {
	found   bool
	state   int
	fp      []byte
	token   string
	fence   int64
	expires int64 // µs, server clock
	result  []byte
	attempt int64 // the last claim's idemdriver.Claim.Attempt (0: never claimed)
	now     int64 // µs, server clock, when the row was read
}

// nextAttempt is the Attempt of a claim that takes r over: one more than
// r's last claim's when it ended without completing (freed by an abandon,
// or in flight past its lease) within idem.AttemptMemory, else 1. The
// statements that claim in one go compute the same.
func (r recordRow) nextAttempt() int64 {
	if r.found && (r.state == stateFree || r.state == stateInFlight) && r.expires > r.now-idem.AttemptMemory.Microseconds() {
		return r.attempt + 1
	}
	return 1
}

// live reports a claim or a result that still counts.
func (r recordRow) live() bool {
	return r.found && (r.state == stateInFlight || r.state == stateCompleted) && r.expires > r.now
}

// otherLayout reports a row whose state this layout does not have: a
// later version's, which no statement of this one takes over (each takes
// a row only in states 0, 1 and 2).
func (r recordRow) otherLayout() bool {
	return r.found && r.state != stateFree && r.state != stateInFlight && r.state != stateCompleted
}

// corrupt says why a row is not one this package writes, or "".
func (r recordRow) corrupt() string {
	switch {
	case !r.found:
		return ""
	case r.state != stateFree && r.state != stateInFlight && r.state != stateCompleted:
		return fmt.Sprintf("unknown state %d", r.state)
	case r.state == stateInFlight && r.token == "":
		return "an in-flight record without a token"
	case r.state == stateCompleted && r.result == nil:
		return "a completed record without a result"
	case r.fence < 0:
		return fmt.Sprintf("negative fence %d", r.fence)
	}
	return ""
}

func (r recordRow) remaining() time.Duration {
	return time.Duration(r.expires-r.now) * time.Microsecond
}

// setRecord writes key's record, which tx has locked and read as r (see
// setLock).
// The row keeps its attempt unless the claim sets one (attempt > 0).
func (s *Store) setRecord(ctx context.Context, tx *sql.Tx, key string, r recordRow, state int, fp []byte, tok string, fence, expires int64, result []byte, attempt ...int64) error {
	a := r.attempt
	if len(attempt) > 0 {
		a = attempt[0]
	}
	res, err := tx.ExecContext(ctx, s.q.recUpdate, state, fp, tok, fence, expires, result, a, []byte(key), r.token, r.fence)
	return s.matchedOne(res, err, "record", key)
}

// Begin implements idemdriver.Store.
//
// A claim whose answer was lost — ctx ended while its statement ran, or
// the connection failed after sending it — may have been written: the
// Store gives it back in the background (abandons it if the record holds
// the token it sent), so that a retry does not find the key in flight
// for nobody until the lease ends.
func (s *Store) Begin(ctx context.Context, k idemdriver.Key, fingerprint string, ttl time.Duration) (idemdriver.Claim, error) {
	if k.Check() == nil && ctx.Err() == nil && !s.closed() {
		// A duplicate of a claim this Store holds, or of a Begin it is
		// sending, is answered here (local.go).
		c, ok, done, err := s.local.begin(ctx, k, fingerprint)
		if ok || err != nil {
			return c, err
		}
		defer func() { done(c, err) }()
		c, err = s.beginOnce(ctx, k, fingerprint, ttl)
		return c, err
	}
	return s.beginOnce(ctx, k, fingerprint, ttl)
}

// beginOnce is Begin's own claim or look in the database.
func (s *Store) beginOnce(ctx context.Context, k idemdriver.Key, fingerprint string, ttl time.Duration) (idemdriver.Claim, error) {
	var sent string
	c, err := s.begin(ctx, k, fingerprint, ttl, &sent, s.local.finishedLately(k.String()))
	if err != nil && sent != "" && (ctx.Err() != nil || connectionLost(err)) {
		s.giveBackUnanswered(k, sent)
	}
	if err == nil && c.State == idemdriver.Acquired {
		s.local.add(k.String(), c.Token, fingerprint, c.Expires)
	}
	return c, err
}

// giveBackUnanswered abandons key's claim in the background if the
// record holds tok (see undoUnanswered).
func (s *Store) giveBackUnanswered(k idemdriver.Key, tok string) {
	s.undoUnanswered(func() bool {
		ctx, cancel := lockdriver.CleanupContext(s.sctx)
		defer cancel()
		return s.Abandon(ctx, idemdriver.Claim{Key: k, State: idemdriver.Acquired, Token: tok}) == nil
	})
}

// begin is Begin; sent is set to the token of each claim it sends. held
// says the key's record is most likely there (a claim of this Store's on
// it finished a moment ago): it is read before a claim is tried, as while
// most of the Store's recent Begins found their key held (seen).
func (s *Store) begin(ctx context.Context, k idemdriver.Key, fingerprint string, ttl time.Duration, sent *string, held bool) (idemdriver.Claim, error) {
	if err := k.Check(); err != nil {
		return idemdriver.Claim{}, err
	}
	key := k.String()
	if err := lockdriver.ValidateTTL(ttl); err != nil {
		return idemdriver.Claim{}, err
	}
	if err := ctx.Err(); err != nil {
		return idemdriver.Claim{}, err
	}
	if err := s.closedErr("begin", key); err != nil {
		return idemdriver.Claim{}, err
	}
	start := time.Now()
	claimFirst := s.replays.Load() <= 0 && !held
	if c, done, err := s.beginOneStatement(ctx, k, key, fingerprint, ttl, start, sent, claimFirst); done {
		return c, err
	}
	if c, done, err := s.beginReadFirst(ctx, k, key, fingerprint, ttl, start, sent, claimFirst); done {
		return c, err
	}
	return s.beginInTx(ctx, k, key, fingerprint, ttl, start, sent)
}

// beginOneStatement is begin's PostgreSQL paths, each one statement (or a
// batch's share of one): done is false when none decided, and the
// transaction of beginInTx goes on.
func (s *Store) beginOneStatement(ctx context.Context, k idemdriver.Key, key, fingerprint string, lease time.Duration, start time.Time, sent *string, claimFirst bool) (c idemdriver.Claim, done bool, err error) {
	if s.begins != nil {
		if c, ok, err := s.beginBatched(ctx, k, fingerprint, lease, start, sent, claimFirst); ok {
			return c, true, err
		}
		// A free, expired or corrupt record, or a failure worth another
		// way: fastBegin below.
	}
	if s.begins == nil && s.q.leanBegin != "" && claimFirst {
		// Most recent Begins claimed their key: one insert claims a new or
		// free key; a live record is read next (fastBegin).
		tok := token.New()
		*sent = tok
		r, err := s.leanBeginOne(ctx, beginArg{key: []byte(key), fp: []byte(fingerprint), tok: tok, lease: us(lease), sweep: s.sweepAfter(lease)})
		switch {
		case err == nil:
			s.seen(false)
			return idemdriver.Claim{Key: k, State: idemdriver.Acquired, Fingerprint: fingerprint, Token: tok, Fence: uint64(r.fence),
				Attempt: int(r.attempt), Expires: start.Add(lease)}, true, nil
		case !errors.Is(err, sql.ErrNoRows) && !retryable(err):
			return idemdriver.Claim{}, true, s.errWrap("begin", key, err)
		}
	}
	if s.begins == nil && s.q.fastBegin != "" && !claimFirst {
		// Most recent Begins found their key held (replays, duplicates):
		// a plain read answers those, in a statement that costs the
		// server a fifth of fastBegin's; a key it finds free, expired or
		// corrupt goes on to fastBegin.
		var r recordRow
		err := s.queryRow(ctx, s.q.recSelect, []byte(key)).Scan(&r.state, &r.fp, &r.token, &r.fence, &r.expires, &r.result, &r.attempt, &r.now)
		r.found = err == nil
		switch {
		case err == nil:
			if c, ok := claimOf(k, fingerprint, r); ok {
				s.seen(true)
				return c, true, nil
			}
		case !errors.Is(err, sql.ErrNoRows):
			return idemdriver.Claim{}, true, s.errWrap("begin", key, err)
		}
	}
	if s.q.fastBegin != "" {
		// One statement claims a free record, or reads the record that
		// holds the key; the transaction below handles the rest.
		tok := token.New()
		*sent = tok
		var claimed bool
		var r recordRow
		err := s.queryRow(ctx, s.q.fastBegin, []byte(key), []byte(fingerprint), tok, us(lease), s.sweepAfter(lease)).
			Scan(&claimed, &r.state, &r.fp, &r.token, &r.fence, &r.expires, &r.result, &r.attempt, &r.now)
		switch {
		case err == nil && claimed:
			s.seen(false)
			return idemdriver.Claim{Key: k, State: idemdriver.Acquired, Fingerprint: fingerprint, Token: tok, Fence: uint64(r.fence),
				Attempt: int(r.attempt), Expires: start.Add(lease)}, true, nil
		case err == nil:
			r.found = true
			if c, ok := claimOf(k, fingerprint, r); ok {
				s.seen(true)
				return c, true, nil
			}
		case !errors.Is(err, sql.ErrNoRows) && !retryable(err):
			return idemdriver.Claim{}, true, s.errWrap("begin", key, err)
		}
		// (A serialization failure, under a session default of
		// REPEATABLE READ: the transaction below, at READ COMMITTED.)
	}
	return idemdriver.Claim{}, false, nil
}

// beginReadFirst is begin's MySQL paths: MariaDB's insert, its upsert
// with RETURNING, and a read followed by an upsert; done is false when
// none decided.
func (s *Store) beginReadFirst(ctx context.Context, k idemdriver.Key, key, fingerprint string, ttl time.Duration, start time.Time, sent *string, claimFirst bool) (c idemdriver.Claim, done bool, err error) {
	read := s.q.myBegin != "" // MySQL: the read-first claim below
	if read && claimFirst && s.returning(ctx) {
		// Most recent Begins claimed their key: most likely a new one
		// (MariaDB; on MySQL 8 an insert would wait for a locked row).
		tok := token.New()
		*sent = tok
		res, err := s.exec(ctx, s.q.myBeginInsert, []byte(key), []byte(fingerprint), tok, us(ttl), s.sweepAfter(ttl))
		switch {
		case err == nil:
			fence, err := res.LastInsertId()
			if err != nil {
				return idemdriver.Claim{}, true, s.errWrap("begin", key, err)
			}
			s.seen(false)
			return idemdriver.Claim{Key: k, State: idemdriver.Acquired, Fingerprint: fingerprint, Token: tok, Fence: uint64(fence),
				Attempt: 1, Expires: start.Add(ttl)}, true, nil
		case !duplicateKey(err) && !retryable(err):
			return idemdriver.Claim{}, true, s.errWrap("begin", key, err)
		}
	}
	if read && claimFirst && s.returning(ctx) {
		// MariaDB: one statement claims a free record or answers with the
		// one that holds the key (its token is then not ours). It does not
		// wait for the row's lock (a writer's effect transaction, another
		// duplicate): a row locked now is answered by the read below,
		// which takes no lock. While most Begins of this Store find their
		// key held (a burst of retries), the read goes first (see seen).
		tok := token.New()
		*sent = tok
		var r recordRow
		err := s.queryRow(ctx, s.q.myBeginReturning, []byte(key), []byte(fingerprint), tok, us(ttl), s.sweepAfter(ttl)).
			Scan(&r.state, &r.fp, &r.token, &r.fence, &r.expires, &r.result, &r.attempt, &r.now)
		switch {
		case err == nil && r.token == tok && r.state == stateInFlight:
			s.seen(false)
			return idemdriver.Claim{Key: k, State: idemdriver.Acquired, Fingerprint: fingerprint, Token: tok, Fence: uint64(r.fence),
				Attempt: int(r.attempt), Expires: start.Add(ttl)}, true, nil
		case err == nil:
			r.found = true
			if c, ok := claimOf(k, fingerprint, r); ok {
				s.seen(true)
				return c, true, nil
			}
			read = false // a corrupt record: the transaction below reports it
		case unsupported(err):
			s.myReturning.Store(2) // (a proxy or a protocol that refuses it)
		case !retryable(err):
			return idemdriver.Claim{}, true, s.errWrap("begin", key, err)
		}
	}
	if read {
		// A look without locks answers a duplicate (one round trip); a
		// free key is claimed by one statement (a second).
		var r recordRow
		err := s.queryRow(ctx, s.q.recSelect, []byte(key)).Scan(&r.state, &r.fp, &r.token, &r.fence, &r.expires, &r.result, &r.attempt, &r.now)
		r.found = err == nil
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return idemdriver.Claim{}, true, s.errWrap("begin", key, err)
		}
		if c, ok := claimOf(k, fingerprint, r); ok {
			s.seen(true)
			return c, true, nil
		}
		s.seen(false)
		if r.corrupt() == "" {
			tok := token.New()
			*sent = tok
			res, err := s.exec(ctx, s.q.myBegin, []byte(key), []byte(fingerprint), tok, us(ttl), s.sweepAfter(ttl))
			if err != nil && !retryable(err) {
				return idemdriver.Claim{}, true, s.errWrap("begin", key, err)
			}
			if fence, ok := myTaken(res, err); ok {
				return idemdriver.Claim{Key: k, State: idemdriver.Acquired, Fingerprint: fingerprint, Token: tok, Fence: uint64(fence),
					Attempt: s.myAttempt(ctx, key, tok, res), Expires: start.Add(ttl)}, true, nil
			}
		}
	}
	return idemdriver.Claim{}, false, nil
}

// beginInTx claims key in a transaction that locks its row: the path that
// decides every case the one-statement ones leave (a corrupt record, a
// serialization failure, a record of another layout).
func (s *Store) beginInTx(ctx context.Context, k idemdriver.Key, key, fingerprint string, ttl time.Duration, start time.Time, sent *string) (idemdriver.Claim, error) {
	var c idemdriver.Claim
	err := s.inTx(ctx, "begin", key, func(tx *sql.Tx) error {
		r, err := s.q.recordRow(ctx, tx, key, true)
		if err != nil {
			return err
		}
		if r.otherLayout() {
			return stop(fmt.Errorf("%w: the record of %q has state %d, which layout %d does not have (a later version wrote it: it is left alone)",
				idem.ErrUnknownLayout, key, r.state, Layout))
		}
		if reason := r.corrupt(); reason != "" {
			return stop(idemdriver.CorruptRecord(key, reason))
		}
		var ok bool
		if c, ok = claimOf(k, fingerprint, r); ok {
			return nil
		}
		c = idemdriver.Claim{Key: k, Fingerprint: fingerprint}
		tok, fence, attempt := token.New(), max(r.fence+1, r.now), r.nextAttempt()
		*sent = tok
		if err := s.setRecord(ctx, tx, key, r, stateInFlight, []byte(fingerprint), tok, fence, r.now+us(ttl), nil, attempt); err != nil {
			return err
		}
		c.State, c.Token, c.Fence, c.Attempt, c.Expires = idemdriver.Acquired, tok, uint64(fence), int(attempt), start.Add(ttl)
		return nil
	})
	return c, err
}

// beginBatched is begin's first steps while concurrent calls share
// statements (batch.go): a claim of a key with no record, and a read that
// answers a live record (a replay, a duplicate in flight, a mismatch) —
// the read first while most of the Store's recent Begins found their key
// held (seen). ok is false when neither decided: a free, expired or
// corrupt record, or a failure the statements after it may get past.
func (s *Store) beginBatched(ctx context.Context, k idemdriver.Key, fingerprint string, lease time.Duration, start time.Time, sent *string, claim bool) (c idemdriver.Claim, ok bool, err error) {
	key := []byte(k.String())
	for range 2 {
		if claim {
			tok := token.New()
			*sent = tok
			r, err := s.begins.do(ctx, beginArg{key: key, fp: []byte(fingerprint), tok: tok, lease: us(lease), sweep: s.sweepAfter(lease)})
			switch {
			case err == nil:
				s.seen(false)
				return idemdriver.Claim{Key: k, State: idemdriver.Acquired, Fingerprint: fingerprint, Token: tok, Fence: uint64(r.fence),
					Attempt: int(r.attempt), Expires: start.Add(lease)}, true, nil
			case retryable(err):
				return idemdriver.Claim{}, false, nil
			case !errors.Is(err, sql.ErrNoRows):
				return idemdriver.Claim{}, true, s.errWrap("begin", k.String(), err)
			}
			claim = false // the key has a record: read it
			continue
		}
		r, err := s.reads.do(ctx, key)
		switch {
		case err == nil:
			if c, ok := claimOf(k, fingerprint, r); ok {
				s.seen(true)
				return c, true, nil
			}
			return idemdriver.Claim{}, false, nil
		case !errors.Is(err, sql.ErrNoRows):
			return idemdriver.Claim{}, true, s.errWrap("begin", k.String(), err)
		}
		claim = true // no record: claim the key
	}
	return idemdriver.Claim{}, false, nil
}

// myAttempt is the Attempt of a claim myBegin made with tok: 1 when it
// inserted the row (one affected row: a taken row counts two); else read
// back, or — if that read fails — 2, as the claim took over a row (the
// count may then be one too high, never too low).
func (s *Store) myAttempt(ctx context.Context, key, tok string, res sql.Result) int {
	if n, err := res.RowsAffected(); err == nil && n == 1 {
		return 1
	}
	var a int64
	if err := s.queryRow(ctx, s.q.myAttempt, []byte(key), tok).Scan(&a); err != nil || a < 1 {
		return 2
	}
	return int(a)
}

// seen counts a Begin that found its key held (held) or not, into a
// score bounded to ±8: above 0, most recent Begins were duplicates, and
// the next one reads before it claims (PostgreSQL: fastBegin, one
// statement without a row lock for a duplicate; MySQL: a read, then a
// claim, three for a new key); otherwise it claims at once (PostgreSQL:
// leanBegin, one insert for a new key, then fastBegin for a duplicate;
// MySQL: two for a new key, one for a duplicate, or two when its row is
// locked).
func (s *Store) seen(held bool) {
	for {
		n := s.replays.Load()
		m := n - 1
		if held {
			m = n + 1
		}
		if m < -8 || m > 8 || s.replays.CompareAndSwap(n, m) {
			return
		}
	}
}

// claimOf is the answer to a Begin that found r holding key: a live
// record (in flight, completed, or another request's), and true; false
// for a record that is free, expired or corrupt.
func claimOf(key idemdriver.Key, fingerprint string, r recordRow) (idemdriver.Claim, bool) {
	if !r.live() || r.corrupt() != "" {
		return idemdriver.Claim{}, false
	}
	c := idemdriver.Claim{Key: key, Fingerprint: fingerprint, Expires: time.Now().Add(r.remaining())}
	switch {
	case string(r.fp) != fingerprint:
		c.State = idemdriver.Mismatch
	case r.state == stateCompleted:
		c.State, c.Result = idemdriver.Completed, r.result
	default:
		c.State = idemdriver.InFlight
	}
	return c, true
}

// own locks c's record in tx and returns it if c still holds it.
func (s *Store) own(ctx context.Context, tx *sql.Tx, c idemdriver.Claim, op string) (recordRow, error) {
	r, err := s.q.recordRow(ctx, tx, c.Key.String(), false)
	if err != nil {
		return r, err
	}
	if !r.live() || r.state != stateInFlight || c.Token == "" || r.token != c.Token {
		return r, stop(fmt.Errorf("sqlstore: %s %q: %w", op, c.Key, lock.ErrLockLost))
	}
	return r, nil
}

// Complete implements idemdriver.Store.
func (s *Store) Complete(ctx context.Context, c idemdriver.Claim, result []byte, retention time.Duration) error {
	defer s.finished(c)
	return s.complete(ctx, c, result, retention, nil)
}

func (s *Store) fits(c idemdriver.Claim, result []byte) error {
	if len(result) > s.maxResult {
		return fmt.Errorf("sqlstore: complete %q: %w: %d bytes, WithMaxResultBytes %d", c.Key, idem.ErrResultTooLarge, len(result), s.maxResult)
	}
	return nil
}

// completing checks a completion's retention and result, and keeps the
// retention for the next claims' sweep_us (sweepAfter).
func (s *Store) completing(c idemdriver.Claim, result []byte, retention time.Duration) error {
	if err := lockdriver.ValidateTTL(retention); err != nil {
		return err
	}
	if r := us(retention); s.retention.Load() != r {
		s.retention.Store(r)
	}
	return s.fits(c, result)
}

// complete stores c's result, after effect (when not nil) in the same
// transaction.
func (s *Store) complete(ctx context.Context, c idemdriver.Claim, result []byte, retention time.Duration, effect Effect) error {
	key := c.Key.String()
	if err := s.completing(c, result, retention); err != nil {
		return err
	}
	if effect == nil && s.q.fastComplete != "" {
		if result == nil {
			result = []byte{}
		}
		_, _, records := s.Tables()
		a := completeArg{key: []byte(key), tok: c.Token, retention: us(retention), result: result}
		var watched bool
		var err error
		if s.completes != nil {
			watched, err = s.completes.do(ctx, a)
		} else {
			watched, err = s.fastCompleteOne(ctx, a)
		}
		if err != nil && !errors.Is(err, sql.ErrNoRows) && !retryable(err) {
			return s.errWrap("complete", key, err)
		}
		if err == nil {
			if watched {
				// A duplicate in another process waits for the record: it
				// is told (best effort: it looks again within its poll).
				// Only then, as NOTIFY serialises the commits of every
				// transaction that sends one.
				_ = s.queryRow(ctx, s.q.notifyWatched, records, keyHash(key)).Scan(new(sql.NullString))
			}
			s.wakeRecord(key)
			return nil
		}
		// Not ours (any more): the transaction below says why.
	}
	if effect == nil && s.q.myComplete != "" {
		if result == nil {
			result = []byte{}
		}
		res, err := s.exec(ctx, s.q.myComplete, us(retention), result, []byte(key), c.Token)
		if err != nil && !retryable(err) {
			return s.errWrap("complete", key, err)
		}
		if n, _ := affected(res, err); n == 1 {
			s.wakeRecord(key)
			return nil
		}
	}
	err := s.inTx(ctx, "complete", key, func(tx *sql.Tx) error {
		return s.completeTx(ctx, tx, c, result, retention, effect)
	})
	if err == nil {
		s.wakeRecord(key)
	}
	return err
}

// completeTx is complete's work in tx: the claim checked (its row locked),
// the effect, the record; with an effect, completeEffect.
func (s *Store) completeTx(ctx context.Context, tx *sql.Tx, c idemdriver.Claim, result []byte, retention time.Duration, effect Effect) error {
	key := c.Key.String()
	if effect != nil && (s.q.fastComplete != "" || s.q.myComplete != "") {
		return s.completeEffect(ctx, tx, c, result, retention, effect)
	}
	r, err := s.own(ctx, tx, c, "complete")
	if err != nil {
		return err
	}
	if effect != nil {
		if err := effect(ctx, tx); err != nil {
			return effectError(ctx, tx, key, err)
		}
	}
	if result == nil {
		result = []byte{}
	}
	if err := s.setRecord(ctx, tx, key, r, stateCompleted, r.fp, "", r.fence, r.now+us(retention), result); err != nil {
		return err
	}
	_, _, records := s.Tables()
	return s.notifyTx(ctx, tx, records, key)
}

// Abandon implements idemdriver.Store: the claim's record is deleted (or freed
// while the clock has not passed its fence) and waiters are woken.
func (s *Store) Abandon(ctx context.Context, c idemdriver.Claim) error {
	defer s.finished(c)
	key := c.Key.String()
	err := s.inTx(ctx, "abandon", key, func(tx *sql.Tx) error {
		r, err := s.own(ctx, tx, c, "abandon")
		if err != nil {
			return err
		}
		return s.freeRecord(ctx, tx, key, r)
	})
	if err == nil {
		s.wakeRecord(key)
	}
	return err
}

func (s *Store) freeRecord(ctx context.Context, tx *sql.Tx, key string, r recordRow) error {
	var err error
	// The row stays, free and keeping its fence, for the cleanup (see
	// cleanupGrace); a corrupt one, whose fence means nothing, goes.
	if r.corrupt() != "" {
		_, err = tx.ExecContext(ctx, s.q.recDelete, []byte(key))
	} else {
		err = s.setRecord(ctx, tx, key, r, stateFree, []byte{}, "", r.fence, r.now, nil)
	}
	if err != nil {
		return err
	}
	_, _, records := s.Tables()
	return s.notifyTx(ctx, tx, records, key)
}

// Extend implements idemdriver.Store.
func (s *Store) Extend(ctx context.Context, c idemdriver.Claim, ttl time.Duration) error {
	if err := lockdriver.ValidateTTL(ttl); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	start := time.Now()
	err := s.inTx(ctx, "extend", c.Key.String(), func(tx *sql.Tx) error {
		r, err := s.own(ctx, tx, c, "extend")
		if err != nil {
			return err
		}
		err = s.setRecord(ctx, tx, c.Key.String(), r, r.state, r.fp, r.token, r.fence, r.now+us(ttl), nil)
		return err
	})
	if err == nil {
		s.local.extend(c.Key.String(), c.Token, start.Add(ttl))
	}
	return err
}

// WaitChange implements idemdriver.Waiter: it returns when key's record is no
// longer in flight (completed, abandoned, deleted or expired), or at
// until. On PostgreSQL with pgx the completion's NOTIFY wakes it (and it
// looks once a second besides); on MySQL it looks without locks, after
// 2 ms and then less often, up to every WithPollInterval.
func (s *Store) WaitChange(ctx context.Context, k idemdriver.Key, until time.Time) error {
	key := k.String()
	if err := s.closedErr("wait for", key); err != nil {
		return err
	}
	_, _, records := s.Tables()
	woken, unsubscribe := s.hub.subscribe(records, keyHash(key))
	defer unsubscribe()
	if c, ok := s.local.get(key); ok {
		// A claim of this Store's: its finish wakes us here (it forgets
		// the claim first, so a finish before we subscribed is seen by
		// this look), or its lease ends.
		t := time.NewTimer(max(min(time.Until(c.until), time.Until(until)), 0))
		defer t.Stop()
		select {
		case <-woken:
		case <-t.C:
		case <-ctx.Done():
			return ctx.Err()
		case <-s.stop:
			return s.closedErr("wait for", key)
		}
		return nil
	}
	for n := 0; ; n++ {
		// Looking first also catches a change between the caller's Begin
		// and the subscription, whose wake-up nobody heard.
		var state int
		var expires, now int64
		var err error
		if s.listen {
			// Marked watched, the record's finish will notify us; a
			// record in flight that another statement changed while this
			// one ran (neither marked by us nor before) is looked at again.
			var watched bool
			var marked int
			err = s.queryRow(ctx, s.q.watch, []byte(key)).Scan(&state, &expires, &watched, &now, &marked)
			if err == nil && state == stateInFlight && expires > now && !watched && marked == 0 {
				if !sleepCtx(ctx, time.Millisecond) {
					return ctx.Err()
				}
				continue
			}
		} else {
			err = s.queryRow(ctx, s.q.recSelect, []byte(key)).Scan(&state, new([]byte), new(string), new(int64), &expires, new([]byte), new(int64), &now)
		}
		if err != nil || state != stateInFlight || expires <= now {
			return ctx.Err() // a store error is the caller's Begin's to report
		}
		wait := time.Until(until)
		if wait <= 0 {
			return nil
		}
		if s.listen {
			wait = min(wait, time.Second) // a notification lost with its connection
		} else {
			wait = min(wait, s.pollDelay(n))
		}
		t := time.NewTimer(wait)
		select {
		case <-woken:
			t.Stop()
			return nil
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-s.stop:
			t.Stop()
			return s.closedErr("wait for", key)
		}
	}
}

var (
	_ idemdriver.Store       = (*Store)(nil)
	_ idemdriver.Waiter      = (*Store)(nil)
	_ idemdriver.EffectStore = (*Store)(nil)
)

// completeEffect is completeTx with an effect, in the Store's own
// transaction: first the record completed by the statement that checks
// the claim (the row's lock, the token, the lease) and — only when a
// duplicate watches it — the notification, then the effect, then the
// commit (the caller's). The record comes first because its row is the
// claim's own, while an effect's rows are often shared (a SKU's stock, an
// account's balance): each of their locks is then held from the effect's
// write to the commit, one round trip, not two. A claim lost
// (ErrLockLost) is found before the effect runs; an effect that fails or
// refuses rolls the completion back with the transaction. Once the
// completion has the record's row lock, no other Begin can take the claim
// over before the transaction ends, however long the effect waits for its
// rows. Two round trips fewer than a look at the record before the effect
// and a notification sent whatever.
func (s *Store) completeEffect(ctx context.Context, tx *sql.Tx, c idemdriver.Claim, result []byte, retention time.Duration, effect Effect) error {
	key := c.Key.String()
	if result == nil {
		result = []byte{}
	}
	lost := stop(fmt.Errorf("sqlstore: complete %q: %w", c.Key, lock.ErrLockLost))
	if s.dialect == Postgres {
		var watched bool
		err := tx.QueryRowContext(ctx, s.q.fastComplete, us(retention), result, []byte(key), c.Token).Scan(&watched)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			return lost
		case err != nil:
			return err
		case watched:
			_, _, records := s.Tables()
			if _, err := tx.ExecContext(ctx, s.q.notifyWatched, records, keyHash(key)); err != nil {
				return err
			}
		}
	} else {
		res, err := tx.ExecContext(ctx, s.q.myComplete, us(retention), result, []byte(key), c.Token)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n != 1 {
			return errors.Join(lost, err)
		}
	}
	if err := effect(ctx, tx); err != nil {
		return effectError(ctx, tx, key, err)
	}
	return nil
}

// sweepAfter is how long after a claim its record's row is first looked at
// by the cleanup (sweep_us, see the schema): its lease, plus the retention
// of the Store's last completion (24 h, a Guard's default retention, before one), at
// most idem.AttemptMemory — how long a claim that does not complete is
// kept. A guess that is short costs the cleanup an update of the row; one
// that is long keeps a row that could go.
func (s *Store) sweepAfter(ttl time.Duration) int64 {
	r := s.retention.Load()
	if r == 0 {
		r = us(24 * time.Hour)
	}
	return us(ttl) + min(r, us(idem.AttemptMemory))
}
