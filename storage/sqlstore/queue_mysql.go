package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/oncekit/oncekit/core/lock/lockdriver"
)

// The server's queue on MySQL and MariaDB (GET_LOCK on a connection of its
// own; KILL QUERY to stop a wait): the variants of queue.go's steps.

// myTryLook takes the session lock and the row if both are free, in one
// statement; when the row was not taken, a second gives the session lock
// back if it was taken and reads the row's expiry.
func (s *Store) myTryLook(ctx context.Context, c *sql.Conn, key, tok, owner string, ttl time.Duration, fresh bool) (look, error) {
	name := s.sessionName(key)
	existed := false
	if fresh {
		// A key this Store has not met lately is most likely new: a plain
		// insert takes it with its session lock (its answer: the fence
		// times two, plus one when GET_LOCK said yes), at the cost of an
		// insert — a statement that may update a row costs the server
		// more than twice that, even when it finds none.
		res, err := connExec(ctx, c, s.q.sqInsert, []byte(key), tok, []byte(owner), name, us(ttl))
		switch {
		case err == nil:
			v, err := res.LastInsertId()
			if err != nil {
				return look{}, err
			}
			return look{taken: true, fence: v / 2, holding: v%2 == 1}, nil
		case !duplicateKey(err):
			return look{}, err
		}
		// The row is there: the session lock, if the insert took it, goes
		// back before the statement that takes a free row.
		if err := c.QueryRowContext(ctx, s.q.sqUntry, name, name, []byte(key), []byte(key)).Scan(new(sql.NullInt64), new(sql.NullInt64), new(bool)); err != nil {
			return look{}, err
		}
		existed = true
	}
	res, err := connExec(ctx, c, s.q.sqTry, []byte(key), tok, []byte(owner), us(ttl), name)
	if err != nil {
		return look{}, err
	}
	if fence, ok := myTaken(res, nil); ok {
		return look{taken: true, fence: fence, holding: true, existed: existed}, nil
	}
	var remaining sql.NullInt64
	var queued bool
	if err := c.QueryRowContext(ctx, s.q.sqUntry, name, name, []byte(key), []byte(key)).Scan(new(sql.NullInt64), &remaining, &queued); err != nil {
		return look{}, err
	}
	if l := leftDur(remaining); l <= 0 && queued {
		// Free, but marked for waiters in the waiters table: the statement
		// that looks there (and clears the mark when nobody waits).
		tl, err := s.myTakeLook(ctx, c, key, tok, owner, ttl)
		tl.existed = existed
		return tl, err
	}
	return look{left: leftDur(remaining), existed: existed}, nil
}

// myWaitLook waits for the session lock for at most budget and takes the
// row if it is free, in one statement; when the row was not taken, a
// second tells whether the session lock was, and reads the row's expiry.
func (s *Store) myWaitLook(ctx context.Context, c *sql.Conn, key, tok, owner string, ttl, budget time.Duration) (look, error) {
	name := s.sessionName(key)
	secs := strconv.FormatFloat(max(budget, time.Millisecond).Seconds(), 'f', 3, 64)
	id, err := s.myConnID(ctx, c)
	if err != nil {
		return look{}, err
	}
	// Not ctx itself: the driver would close the connection when ctx
	// ends, and the server, which notices that late, would go on waiting
	// in GET_LOCK and take the row for nobody when the holder lets go. A
	// KILL QUERY from another connection ends the statement instead; the
	// GET_LOCK timeout bounds it, and a deadline a little past that
	// bounds a connection that stopped answering.
	done, ok := s.holdOpen() // (Close ends the wait with it)
	if !ok {
		return look{}, s.closedErr("acquire", key)
	}
	defer done()
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), budget+lockdriver.ReleaseTimeout)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { s.myKillQuery(id) })
	res, err := connExec(wctx, c, s.q.sqWait, []byte(key), tok, []byte(owner), us(ttl), name, secs)
	if !stop() {
		// Killed (or about to be): whatever the statement did, the
		// caller gives up; a row it took for tok is given back, and c,
		// which a late KILL QUERY could still reach, goes.
		if _, ok := myTaken(res, err); ok {
			s.releaseRow(key, tok)
		}
		return look{}, errConnKilled
	}
	if err != nil {
		return look{}, err
	}
	if fence, ok := myTaken(res, nil); ok {
		return look{taken: true, fence: fence, holding: true, queued: true}, nil
	}
	var holding, remaining sql.NullInt64
	if err := c.QueryRowContext(ctx, s.q.sqHeld, name, []byte(key)).Scan(&holding, &remaining); err != nil {
		return look{}, err
	}
	if holding.Int64 != 1 {
		return look{left: leftDur(remaining)}, errWaitEnded
	}
	l := leftDur(remaining)
	// (A free row not taken is marked for the waiters table: looked at
	// again at once, by the statement that looks there.)
	return look{holding: true, left: l, unknown: l <= 0}, nil
}

// errConnKilled: a wait that ctx ended was killed on the server; its
// connection must not be used again (see myWaitLook).
var errConnKilled = errors.New("sqlstore: the wait was ended by KILL QUERY")

// connID is a MySQL session: its CONNECTION_ID() and the server it is on
// (myServer), for a KILL QUERY that must reach that server and no other.
type connID struct {
	id     int64
	server string
}

// myServer names the server a connection is on: behind a proxy that
// spreads connections over several servers (ProxySQL, HAProxy in front of
// a Galera cluster), connection ids are per server, and the same id on
// another server is another session.
const myServer = "CONCAT(@@hostname, ':', @@port, ':', @@server_id)"

// myKillQuery ends the statement of session target (KILL QUERY), sent on
// a connection of the pool that is on the same server: a connection of
// another server would end an unrelated statement with that id. It tries
// a few connections; when none is on target's server, nothing is killed,
// and the statement ends by its own timeout (GET_LOCK's).
func (s *Store) myKillQuery(target connID) {
	kctx, cancel := lockdriver.CleanupContext(context.Background())
	defer cancel()
	var held []*sql.Conn // held, so that the next one is another connection
	defer func() {
		for _, c := range held {
			_ = c.Close()
		}
	}()
	for range myKillTries {
		c, err := s.db.Conn(kctx)
		if err != nil {
			return
		}
		held = append(held, c)
		var server string
		if err := c.QueryRowContext(kctx, "SELECT "+myServer).Scan(&server); err != nil || server != target.server {
			continue
		}
		_, _ = c.ExecContext(kctx, "KILL QUERY "+strconv.FormatInt(target.id, 10))
		return
	}
}

// myKillTries is how many of the pool's connections myKillQuery looks at
// for one on the waiter's server.
const myKillTries = 4

// myConnID is the server's id of c's session (CONNECTION_ID()) and the
// server's name, asked once per driver connection.
func (s *Store) myConnID(ctx context.Context, c *sql.Conn) (connID, error) {
	var dc any
	_ = c.Raw(func(d any) error { dc = d; return nil })
	if mc, ok := dc.(*myConn); ok && mc.id.id != 0 {
		return mc.id, nil
	}
	if id, ok := s.connIDs.Load(dc); ok {
		return id.(connID), nil
	}
	var id connID
	if err := c.QueryRowContext(ctx, "SELECT CONNECTION_ID(), "+myServer).Scan(&id.id, &id.server); err != nil {
		return connID{}, err
	}
	if mc, ok := dc.(*myConn); ok {
		mc.id = id // (c is ours until the caller hands it back)
		return id, nil
	}
	if s.connIDCount.Add(1) > 4096 { // connections come and go: start over
		s.connIDs.Clear()
		s.connIDCount.Store(1)
	}
	s.connIDs.Store(dc, id)
	return id, nil
}

// myTakeLook takes the row if it is free (the session lock as it is).
func (s *Store) myTakeLook(ctx context.Context, c *sql.Conn, key, tok, owner string, ttl time.Duration) (look, error) {
	res, err := connExec(ctx, c, s.q.myAcquire, []byte(key), tok, []byte(owner), us(ttl), []byte(key))
	if err != nil {
		return look{}, err
	}
	if fence, ok := myTaken(res, nil); ok {
		return look{taken: true, fence: fence}, nil
	}
	var remaining sql.NullInt64
	if err := c.QueryRowContext(ctx, s.q.sqLeft, []byte(key)).Scan(&remaining); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return look{}, err
	}
	return look{left: leftDur(remaining)}, nil
}

// myReleasePinned is releasePinned on MySQL: the session lock is given
// back inside the UPDATE that frees the row, while it holds the row's
// lock (the next waiter's take waits for its commit).
func (s *Store) myReleasePinned(ctx context.Context, l *lease, c *sql.Conn) (bool, error) {
	name := s.sessionName(l.key)
	res, err := connExec(ctx, c, s.q.sqRelease, name, []byte(l.key), l.Token())
	if err != nil {
		discard(c)
		return false, err
	}
	if n, _ := res.RowsAffected(); n == 1 {
		_ = c.Close()
		return true, nil
	}
	s.unlockSession(ctx, c, l.key) // (more holds, or not ours)
	return false, nil
}

// mySessionQueries are the statements of the server's queue on MySQL.
func mySessionQueries(q *queries, locks, now string) {
	// q.myAcquire behind GET_LOCK(name, timeout), which runs first: the
	// row is looked at only once the session lock is ours
	// (LAST_INSERT_ID(0) first: a statement that inserts nothing answers
	// 0). The clock of a statement that waits is its start (NOW) plus
	// the time it has run (SYSDATE - NOW): UTC_TIMESTAMP stays at the
	// start, and the row would be taken with its TTL already spent.
	// They name no other table: a key marked queued (a waiter queued in
	// the waiters table) is not taken by them but by myAcquire, which
	// looks there (myTakeLook), as on PostgreSQL.
	lockFirst := func(timeout, now string) string {
		return "INSERT INTO " + locks + " (lock_key, token, owner, holds, fence, expires_us)" +
			" SELECT ?, ?, ?, 1, LAST_INSERT_ID(" + now + "), " + now + " + ? FROM DUAL" +
			" WHERE LAST_INSERT_ID(0) = 0 AND GET_LOCK(?, " + timeout + ") = 1" + q.myTakeLean
	}
	q.sqTry = lockFirst("0", now)
	// A new key with its session lock, by a plain insert (UTC_TIMESTAMP
	// is the statement's start wherever it is read: the fence in the row
	// and in the answer are one).
	q.sqInsert = "INSERT INTO " + locks + " (lock_key, token, owner, holds, fence, expires_us) VALUES (?, ?, ?," +
		" IF(LAST_INSERT_ID(" + now + " * 2 + IFNULL(GET_LOCK(?, 0), 0)) > 0, 1, 1), " + now + ", " + now + " + ?)"
	running := "(" + now + " + TIMESTAMPDIFF(MICROSECOND, NOW(6), SYSDATE(6)))"
	q.sqWait = strings.ReplaceAll(lockFirst("?", now), now, running)
	q.sqUntry = "SELECT IF(IS_USED_LOCK(?) = CONNECTION_ID(), RELEASE_LOCK(?), 0), (SELECT CAST(expires_us AS SIGNED) - " + now + " FROM " + locks + " WHERE lock_key = ?)," +
		" COALESCE((SELECT queued FROM " + locks + " WHERE lock_key = ?), FALSE)"
	q.sqHeld = "SELECT IS_USED_LOCK(?) = CONNECTION_ID(), (SELECT CAST(expires_us AS SIGNED) - " + now + " FROM " + locks + " WHERE lock_key = ?)"
	q.sqLeft = "SELECT CAST(expires_us AS SIGNED) - " + now + " FROM " + locks + " WHERE lock_key = ?"
	q.sqRelease = "UPDATE " + locks + " SET token = IF(RELEASE_LOCK(?) IS NULL, '', ''), owner = '', holds = 0, expires_us = " + now +
		" WHERE lock_key = ? AND token = ? AND holds = 1 AND expires_us > " + now
	q.sqUnlock = "SELECT RELEASE_LOCK(?) = 1"
}
