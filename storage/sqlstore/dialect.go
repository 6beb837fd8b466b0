package sqlstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/oncekit/oncekit/core/idem"
)

// Dialect names the SQL the Store speaks.
type Dialect string

const (
	// Postgres: PostgreSQL 12 or later, through github.com/jackc/pgx/v5
	// (stdlib) or any database/sql driver; with pgx, waiters are woken by
	// LISTEN/NOTIFY.
	Postgres Dialect = "postgres"
	// MySQL: MySQL 8 or MariaDB 10.6 and later, through
	// github.com/go-sql-driver/mysql. Waiters poll (see WithPollInterval).
	MySQL Dialect = "mysql"
)

// queries are the statements of one Store, built once for its dialect and
// table names. Every statement uses ? for its parameters; rebind turns them
// into $1, $2, ... for PostgreSQL.
type queries struct {
	dialect Dialect

	lockUpsert, lockSelect, lockSelectForUpdate, lockUpdate        string
	queueHead, queueUpsert, queueDelete, queueCount                string
	queueMark                                                      string // MySQL: a waiter queued in the table marks the key's row
	recUpsert, recSelect, recSelectForUpdate, recUpdate, recDelete string
	recList                                                        string
	queueHeadNow, notifyHead, peek                                 string
	notify                                                         string    // PostgreSQL only
	cleanup                                                        [4]string // locks, records, records' sweep_us (see the schema), waiters
	cleanupPick, cleanupByKey                                      string    // MySQL: the locks table's cleanup, by key
	// PostgreSQL's one-statement fast paths ("" on MySQL): the common
	// case of each operation in one round trip; anything else falls back
	// to the transaction.
	fastAcquire, fastRelease, fastBegin, fastComplete string
	leanBegin, notifyWatched, notifyMany              string // PostgreSQL: see Store.Begin, Store.complete
	leanBeginMany, fastCompleteMany, recSelectMany    string // PostgreSQL: leanBegin, fastComplete and recSelect for many calls (batch.go)
	releaseNotify                                     string // PostgreSQL: fastRelease and notifyHead in one statement
	watch                                             string // PostgreSQL: a duplicate marks the record it waits for
	// MySQL's: one statement each, answering by the rows it affected and
	// by LAST_INSERT_ID(expr), which carries the fence a take issued.
	myAcquire, myRelease, myBegin, myComplete, myBeginInsert string
	myTakeLean                                               string // myAcquire's ON DUPLICATE KEY UPDATE without the waiters table
	// myBeginReturning is myBegin answering with the record as the
	// statement left it (MariaDB 10.5 and later: INSERT ... RETURNING),
	// so that a duplicate or a replay needs no read before it.
	myBeginReturning string
	myAttempt        string // a MySQL claim's attempt, read back (myAttempt)
	// renewHold: a hold of this Store handing its key on inside the
	// process renews its expiry and reserves the next fences (handoff.go).
	renewHold string
	// headAcquire: the first queued waiter takes the free key and leaves
	// the queue (PostgreSQL: one statement; MySQL: it, then queueDelete).
	headAcquire string
	// The server's queue (PostgreSQL, queue.go): the session lock and the
	// row when both are free, the same after queuing for the session lock,
	// the row alone, the release of both, the session lock's release, and
	// the count of sessions queued for it.
	sqTry, sqWait, sqTake, sqRelease, sqUnlock, sqWaiting string
	sqTryFull                                             string // PostgreSQL: sqTry, looking in the waiters table
	sqHeld                                                string // 1 when the session holds the key's session lock; the row's expiry
	sqLeft                                                string // the row's expiry less the server's clock
	sqUntry, sqInsert                                     string // MySQL
}

// cleanupGrace is how long a row outlives both its expiry and its fence
// (by the server's clock) before the cleanup deletes it. A statement reads
// the clock when it starts, and may get a key's row lock later: on
// PostgreSQL, a one-statement acquisition or claim of a key whose row is
// gone inserts the clock it read as the fence. Keeping rows (free ones
// too) until the clock is a minute past their fence means such a
// statement would have to wait a minute for its lock to issue a fence
// that is not the highest.
const cleanupGrace = time.Minute

// nowUS is the server's clock in microseconds since the Unix epoch, read
// when the statement runs (PostgreSQL's now() is the transaction's start).
func nowUS(d Dialect) string {
	if d == Postgres {
		return "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000000 AS BIGINT)"
	}
	// From UTC_TIMESTAMP, whatever the session's time zone: UNIX_TIMESTAMP
	// of the local NOW() reads a repeated autumn hour as its first pass,
	// an hour back.
	return "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))"
}

// newQueries builds the statements of a Store of dialect d whose tables
// have prefix: the dialect's own (pgQueries, myQueries), then those both
// share.
func newQueries(d Dialect, prefix string) queries {
	t := newQueryText(d, prefix)
	q := queries{dialect: d}
	if d == Postgres {
		pgQueries(&q, t)
	} else {
		myQueries(&q, t)
	}
	commonQueries(&q, t)
	if d == Postgres {
		for _, s := range []*string{&q.lockUpsert, &q.lockSelect, &q.lockSelectForUpdate, &q.lockUpdate,
			&q.queueHead, &q.queueUpsert, &q.queueDelete, &q.queueCount, &q.recUpsert, &q.recSelect,
			&q.recSelectForUpdate, &q.recUpdate, &q.recDelete, &q.recList, &q.notify, &q.queueHeadNow, &q.notifyHead, &q.peek, &q.fastAcquire, &q.fastRelease, &q.fastComplete, &q.cleanup[0], &q.cleanup[1], &q.cleanup[2], &q.cleanup[3]} {
			*s = rebind(*s)
		}
	}
	return q
}

// queryText is what the statements of one Store are written with: its
// tables, its dialect's clock, the columns it reads, and the conditions
// the cleanup and the fences share.
type queryText struct {
	locks, waiters, records, now, old, lockCols, recCols, memory, forgotten, mayGo, reserve string
}

func newQueryText(d Dialect, prefix string) queryText {
	locks, waiters, records := prefix+"locks", prefix+"lock_waiters", prefix+"records"
	now := nowUS(d)
	old := "(" + now + " - " + strconv.FormatInt(cleanupGrace.Microseconds(), 10) + ")"
	lockCols := "token, owner, holds, fence, expires_us, " + now
	recCols := "state, fingerprint, token, fence, expires_us, result, attempt, " + now
	// A claim's attempt: one more than the row's when the row's last
	// claim ended without completing (freed, or in flight past its lease)
	// within idem.AttemptMemory, else 1. (See recordRow.nextAttempt.)
	memory := strconv.FormatInt(idem.AttemptMemory.Microseconds(), 10)
	// A row the cleanup may delete besides its expiry and fence: not a
	// claim that ended without completing within the memory.
	forgotten := "(state = 2 OR expires_us < " + now + " - " + memory + ")"
	// When a record row may go: past its expiry (plus the attempt memory
	// unless completed) and its fence; the sweep sets it for the rows it
	// finds past their sweep_us that may not go yet (never before now, so
	// one pass does not meet a row twice).
	mayGo := "GREATEST(expires_us + CASE WHEN state = 2 THEN 0 ELSE " + memory + " END, fence, " + now + ")"
	// The hold's row stays its token's; its fence goes up by the fences
	// reserved, so that every fence issued later is above them.
	reserve := strconv.Itoa(reservedFences)
	return queryText{locks: locks, waiters: waiters, records: records, now: now, old: old, lockCols: lockCols,
		recCols: recCols, memory: memory, forgotten: forgotten, mayGo: mayGo, reserve: reserve}
}

// pgQueries are PostgreSQL's own statements.
func pgQueries(q *queries, t queryText) {
	locks, waiters, now, reserve := t.locks, t.waiters, t.now, t.reserve
	pgRowQueries(q, t)
	pgFastQueries(q, t)
	q.headAcquire = "WITH h AS (" + strings.Replace(q.queueHeadNowRaw(waiters, now), "?", "$1", 1) + ")," +
		" t AS (UPDATE " + locks + " l SET token = $2, owner = $3, holds = 1, fence = GREATEST(l.fence + 1, " + now + ")," +
		" expires_us = " + now + " + $4 WHERE l.lock_key = $1 AND (l.token = '' OR l.expires_us <= " + now + ")" +
		" AND (SELECT waiter FROM h) = $5 RETURNING l.fence)," +
		" d AS (DELETE FROM " + waiters + " WHERE lock_key = $1 AND waiter = $5 AND EXISTS (SELECT 1 FROM t))" +
		" SELECT fence FROM t"
	sessionQueries(q, locks, waiters, now)
	q.renewHold = "UPDATE " + locks + " SET fence = fence + " + reserve + ", expires_us = " + now + " + $3" +
		" WHERE lock_key = $1 AND token = $2 AND holds = 1 AND expires_us > " + now + " RETURNING fence"
}

// pgRowQueries are PostgreSQL's row upserts, queue and cleanup statements.
func pgRowQueries(q *queries, t queryText) {
	locks, waiters, records, now, old, lockCols, recCols, forgotten, mayGo := t.locks, t.waiters, t.records, t.now, t.old, t.lockCols, t.recCols, t.forgotten, t.mayGo
	// One statement takes the row lock and reads the row, creating a
	// free row for a key never seen (or deleted).
	q.lockUpsert = "INSERT INTO " + locks + " (lock_key, token, owner, holds, fence, expires_us) VALUES (?, '', ''::bytea, 0, 0, 0)" +
		" ON CONFLICT (lock_key) DO UPDATE SET lock_key = EXCLUDED.lock_key RETURNING " + lockCols
	q.recUpsert = "INSERT INTO " + records + " (record_key, state, fingerprint, token, fence, expires_us) VALUES (?, 0, ''::bytea, '', 0, 0)" +
		" ON CONFLICT (record_key) DO UPDATE SET record_key = EXCLUDED.record_key RETURNING " + recCols
	// A waiter queued here marks the key's row (queued): the server
	// queue's statements then look in this table (see sessionQueries).
	q.queueUpsert = "WITH m AS (UPDATE " + locks + " SET queued = true WHERE lock_key = $1 AND NOT queued)" +
		" INSERT INTO " + waiters + " (lock_key, waiter, seq, expires_us) VALUES ($1, $2, " + now + ", " + now + " + $3)" +
		" ON CONFLICT (lock_key, waiter) DO UPDATE SET expires_us = EXCLUDED.expires_us"
	q.notify = "SELECT pg_notify(?, ?) FROM " + records + " WHERE record_key = ? AND watched"
	q.cleanup = [4]string{
		"DELETE FROM " + locks + " WHERE lock_key IN (SELECT lock_key FROM " + locks +
			" WHERE expires_us < " + old + " AND fence < " + old + " LIMIT ? FOR UPDATE SKIP LOCKED)",
		"DELETE FROM " + records + " WHERE record_key IN (SELECT record_key FROM " + records +
			" WHERE sweep_us < " + old + " AND expires_us < " + old + " AND fence < " + old + " AND " + forgotten + " LIMIT ? FOR UPDATE SKIP LOCKED)",
		"UPDATE " + records + " SET sweep_us = " + mayGo + " WHERE record_key IN (SELECT record_key FROM " + records +
			" WHERE sweep_us < " + old + " LIMIT ? FOR UPDATE SKIP LOCKED)",
		"DELETE FROM " + waiters + " WHERE (lock_key, waiter) IN (SELECT lock_key, waiter FROM " + waiters +
			" WHERE expires_us < " + old + " LIMIT ? FOR UPDATE SKIP LOCKED)",
	}
}

// pgFastQueries are PostgreSQL's one-statement fast paths.
func pgFastQueries(q *queries, t queryText) {
	locks, waiters, records, now, recCols, memory := t.locks, t.waiters, t.records, t.now, t.recCols, t.memory
	// A free, expired or never-seen key with nobody queued: taken.
	q.fastAcquire = "INSERT INTO " + locks + " AS l (lock_key, token, owner, holds, fence, expires_us)" +
		" SELECT ?, ?, ?, 1, n.now, n.now + ? FROM (SELECT " + now + " AS now) n" +
		" ON CONFLICT (lock_key) DO UPDATE SET token = EXCLUDED.token, owner = EXCLUDED.owner, holds = 1," +
		" fence = GREATEST(l.fence + 1, EXCLUDED.fence), expires_us = EXCLUDED.expires_us" +
		" WHERE (l.token = '' OR l.expires_us <= EXCLUDED.fence)" +
		" AND NOT EXISTS (SELECT 1 FROM " + waiters + " w WHERE w.lock_key = l.lock_key AND w.expires_us > EXCLUDED.fence)" +
		" RETURNING fence"
	// The last hold of a key: the row is freed (kept, with its fence:
	// see cleanupGrace). The first waiter is notified by a statement
	// of its own (notifyHead): one that starts after this one got the
	// row's lock sees a waiter that queued while it waited for it,
	// which this statement's snapshot would not.
	q.fastRelease = "UPDATE " + locks + " SET token = '', owner = ''::bytea, holds = 0, expires_us = " + now +
		" WHERE lock_key = ? AND token = ? AND holds = 1 AND expires_us > " + now
	// The same in one statement with the notification, when nobody
	// changed the row since the statement's snapshot was taken (its
	// xmin is the one read then): a waiter queues in a transaction that
	// changes the row, so one that queued while this statement waited
	// for the row's lock fails the check, and the two statements above
	// run instead. Otherwise the snapshot has every queued waiter.
	q.releaseNotify = "WITH b AS (SELECT xmin AS x FROM " + locks + " WHERE lock_key = $1)," +
		" u AS (UPDATE " + locks + " l SET token = '', owner = ''::bytea, holds = 0, expires_us = " + now + " FROM b" +
		" WHERE l.lock_key = $1 AND l.token = $2 AND l.holds = 1 AND l.expires_us > " + now + " AND l.xmin = b.x RETURNING 1)," +
		" h AS (" + strings.Replace(q.queueHeadNowRaw(waiters, now), "?", "$1", 1) + ")" +
		" SELECT (SELECT count(*) FROM u), (SELECT waiter FROM h WHERE EXISTS (SELECT 1 FROM u))," +
		" (SELECT pg_notify($3, waiter) FROM h WHERE EXISTS (SELECT 1 FROM u))"
	// A free, expired or never-seen record: claimed; else the record
	// as it was before the statement, for the caller to read. A record
	// live in the statement's snapshot (a duplicate of a claim in
	// flight, a replay) is only read: no row lock, so duplicates of
	// one key do not queue behind each other.
	q.fastBegin = "WITH cur AS (SELECT state, expires_us FROM " + records + " WHERE record_key = $1)," +
		" c AS (INSERT INTO " + records + " AS r (record_key, state, fingerprint, token, fence, expires_us, attempt, sweep_us)" +
		" SELECT $1, 1, $2, $3, n.now, n.now + $4, 1, n.now + $5 FROM (SELECT " + now + " AS now) n" +
		" WHERE NOT EXISTS (SELECT 1 FROM cur WHERE cur.state IN (1, 2) AND cur.expires_us > n.now)" +
		" ON CONFLICT (record_key) DO UPDATE SET state = 1, fingerprint = EXCLUDED.fingerprint, token = EXCLUDED.token," +
		" fence = GREATEST(r.fence + 1, EXCLUDED.fence), expires_us = EXCLUDED.expires_us, result = NULL," +
		" attempt = CASE WHEN r.state IN (0, 1) AND r.expires_us > EXCLUDED.fence - " + memory + " THEN r.attempt + 1 ELSE 1 END" +
		" WHERE r.state = 0 OR (r.state IN (1, 2) AND r.expires_us <= EXCLUDED.fence) RETURNING fence, attempt)" +
		" SELECT true, 1, ''::bytea, '', fence, 0::bigint, NULL::bytea, attempt, 0::bigint FROM c" +
		" UNION ALL SELECT false, " + recCols + " FROM " + records +
		" WHERE record_key = $1 AND NOT EXISTS (SELECT 1 FROM c)"
	// A completion notifies only when a duplicate waits for the record
	// (watched): NOTIFY serialises the commits of every transaction
	// that sends one. The UPDATE's RETURNING reads the row's latest
	// version, so a duplicate that marked it while this statement
	// waited for the row's lock is seen.
	q.fastComplete = "UPDATE " + records + " SET state = 2, token = '', expires_us = " + now + " + ?, result = ?" +
		" WHERE record_key = ? AND state = 1 AND token = ? AND expires_us > " + now + " RETURNING watched"
	q.notifyWatched = "SELECT pg_notify($1, $2)"
	q.notifyMany = "SELECT pg_notify($1, h) FROM unnest($2::text[]) AS h"
	// The common claim of a key met for the first time: one insert; a
	// row that is there (free, expired, live, or locked by a writer's
	// transaction) is left as it is, without waiting for its lock, and
	// fastBegin claims or reads it next. Used while most of a Store's
	// recent Begins claimed their key (Store.seen).
	q.leanBegin = "INSERT INTO " + records + " (record_key, state, fingerprint, token, fence, expires_us, attempt, sweep_us)" +
		" SELECT $1, 1, $2, $3, n.now, n.now + $4, 1, n.now + $5 FROM (SELECT " + now + " AS now) n" +
		" ON CONFLICT (record_key) DO NOTHING RETURNING fence, attempt"
	// leanBegin and fastComplete for many calls at once (batch.go):
	// arrays of the calls' arguments, one row per call, answered by
	// token. The claims go in key order (see batch.go), and only for
	// keys with no row in the statement's snapshot: an insert that
	// meets a row whose update is not committed yet (a duplicate of a
	// claim whose effect transaction runs) waits for that transaction,
	// and would hold up every call of the batch with it.
	q.leanBeginMany = "INSERT INTO " + records + " (record_key, state, fingerprint, token, fence, expires_us, attempt, sweep_us)" +
		" SELECT v.k, 1, v.fp, v.tok, n.now, n.now + v.lease, 1, n.now + v.sweep FROM (SELECT " + now + " AS now) n," +
		" unnest($1::bytea[], $2::bytea[], $3::text[], $4::bigint[], $5::bigint[]) AS v(k, fp, tok, lease, sweep)" +
		" WHERE NOT EXISTS (SELECT 1 FROM " + records + " r WHERE r.record_key = v.k)" +
		" ORDER BY v.k ON CONFLICT (record_key) DO NOTHING RETURNING token, fence, attempt"
	q.recSelectMany = "SELECT record_key, " + recCols + " FROM " + records + " WHERE record_key = ANY($1::bytea[])"
	// (The clock is read per row, as fastComplete reads it: a lease
	// that ends while the statement waits for a row's lock is over.)
	q.fastCompleteMany = "UPDATE " + records + " r SET state = 2, token = '', expires_us = " + now + " + v.ret, result = v.res" +
		" FROM unnest($1::bytea[], $2::text[], $3::bigint[], $4::bytea[]) AS v(k, tok, ret, res)" +
		" WHERE r.record_key = v.k AND r.state = 1 AND r.token = v.tok AND r.expires_us > " + now + " RETURNING v.tok, r.watched"
	// A duplicate's look before it waits: it marks the record in
	// flight watched (once), and reads it as the statement's snapshot
	// had it, with whether it marked it.
	q.watch = "WITH u AS (UPDATE " + records + " SET watched = true WHERE record_key = $1 AND state = 1" +
		" AND expires_us > " + now + " AND NOT watched RETURNING 1)" +
		" SELECT state, expires_us, watched, " + now + ", (SELECT count(*) FROM u) FROM " + records + " WHERE record_key = $1"
}

// myQueries are MySQL's own statements.
func myQueries(q *queries, t queryText) {
	locks, waiters, records, now, old, recCols, memory, forgotten, mayGo, reserve := t.locks, t.waiters, t.records, t.now, t.old, t.recCols, t.memory, t.forgotten, t.mayGo, t.reserve
	// MySQL has no RETURNING: an upsert that changes nothing takes the
	// row's exclusive lock (or inserts it), a locking read follows.
	q.lockUpsert = "INSERT INTO " + locks + " (lock_key, token, owner, holds, fence, expires_us) VALUES (?, '', '', 0, 0, 0)" +
		" ON DUPLICATE KEY UPDATE lock_key = lock_key"
	q.recUpsert = "INSERT INTO " + records + " (record_key, state, fingerprint, token, fence, expires_us) VALUES (?, 0, '', '', 0, 0)" +
		" ON DUPLICATE KEY UPDATE record_key = record_key"
	q.queueUpsert = "INSERT INTO " + waiters + " (lock_key, waiter, seq, expires_us) VALUES (?, ?, " + now + ", " + now + " + ?)" +
		" ON DUPLICATE KEY UPDATE expires_us = VALUES(expires_us)"
	// (After queueUpsert: see the PostgreSQL one.)
	q.queueMark = "UPDATE " + locks + " SET queued = TRUE WHERE lock_key = ? AND NOT queued"
	// (The locks table's: see Store.cleanupStep.)
	q.cleanupPick = "SELECT lock_key FROM " + locks + " WHERE expires_us < " + old + " AND fence < " + old + " LIMIT ?"
	q.cleanupByKey = "DELETE FROM " + locks + " WHERE expires_us < " + old + " AND fence < " + old
	q.cleanup = [4]string{
		"DELETE FROM " + locks + " WHERE expires_us < " + old + " AND fence < " + old + " LIMIT ?",
		"DELETE FROM " + records + " WHERE sweep_us < " + old + " AND expires_us < " + old + " AND fence < " + old + " AND " + forgotten + " LIMIT ?",
		"UPDATE " + records + " SET sweep_us = " + mayGo + " WHERE sweep_us < " + old + " LIMIT ?",
		"DELETE FROM " + waiters + " WHERE expires_us < " + old + " LIMIT ?",
	}
	// ON DUPLICATE KEY UPDATE assigns left to right, each assignment
	// seeing the ones before: token goes first, on the row's old
	// values; the rest follow only where it now holds our token. The
	// statement reports whether it took the row by LAST_INSERT_ID:
	// the fence it issued, or 0 (myTaken).
	won := "token = VALUES(token)"
	takeFree := func(free string) string {
		return " ON DUPLICATE KEY UPDATE token = IF((token = '' OR expires_us <= " + now + ") AND " + free + ", VALUES(token), token)," +
			" fence = IF(" + won + ", LAST_INSERT_ID(GREATEST(fence + 1, " + now + ")), fence + LAST_INSERT_ID(0))," +
			" owner = IF(" + won + ", VALUES(owner), owner), holds = IF(" + won + ", 1, holds)," +
			" expires_us = IF(" + won + ", VALUES(expires_us), expires_us), queued = IF(" + won + ", FALSE, queued)"
	}
	// (Its last parameter: the key again, for the waiters table.)
	q.myAcquire = "INSERT INTO " + locks + " (lock_key, token, owner, holds, fence, expires_us)" +
		" VALUES (?, ?, ?, 1, LAST_INSERT_ID(" + now + "), " + now + " + ?)" +
		takeFree("NOT EXISTS (SELECT 1 FROM "+waiters+" w WHERE w.lock_key = ? AND w.expires_us > "+now+")")
	// The same update naming no other table (the server queue's; see
	// sessionQueries): a key whose row is marked queued is not taken.
	q.myTakeLean = takeFree("NOT queued")
	q.myRelease = "UPDATE " + locks + " SET token = '', owner = '', holds = 0, expires_us = " + now +
		" WHERE lock_key = ? AND token = ? AND holds = 1 AND expires_us > " + now
	q.myBegin = "INSERT INTO " + records + " (record_key, state, fingerprint, token, fence, expires_us, result, attempt, sweep_us)" +
		" VALUES (?, 1, ?, ?, LAST_INSERT_ID(" + now + "), " + now + " + ?, NULL, 1, " + now + " + ?) ON DUPLICATE KEY UPDATE" +
		" token = IF(state = 0 OR (state IN (1, 2) AND expires_us <= " + now + "), VALUES(token), token)," +
		" attempt = IF(" + won + ", IF(state IN (0, 1) AND expires_us > " + now + " - " + memory + ", attempt + 1, 1), attempt)," +
		" state = IF(" + won + ", 1, state), fingerprint = IF(" + won + ", VALUES(fingerprint), fingerprint)," +
		" fence = IF(" + won + ", LAST_INSERT_ID(GREATEST(fence + 1, " + now + ")), fence + LAST_INSERT_ID(0))," +
		" expires_us = IF(" + won + ", VALUES(expires_us), expires_us), result = IF(" + won + ", NULL, result)"
	q.myAttempt = "SELECT attempt FROM " + records + " WHERE record_key = ? AND token = ?"
	// A key never met: a plain insert (an update that may find a row
	// costs the server more than twice as much, even when it finds
	// none); refused with a duplicate key when the row is there, at
	// once when its row is locked (MariaDB: SET STATEMENT).
	q.myBeginInsert = "SET STATEMENT innodb_lock_wait_timeout = 0 FOR INSERT INTO " + records + " (record_key, state, fingerprint, token, fence, expires_us, result, attempt, sweep_us)" +
		" VALUES (?, 1, ?, ?, LAST_INSERT_ID(" + now + "), " + now + " + ?, NULL, 1, " + now + " + ?)"
	q.myBeginReturning = "SET STATEMENT innodb_lock_wait_timeout = 0 FOR " + q.myBegin + " RETURNING " + recCols
	mySessionQueries(q, locks, now)
	q.myComplete = "UPDATE " + records + " SET state = 2, token = '', expires_us = " + now + " + ?, result = ?" +
		" WHERE record_key = ? AND state = 1 AND token = ? AND expires_us > " + now
	q.headAcquire = "UPDATE " + locks + " SET token = ?, owner = ?, holds = 1, fence = LAST_INSERT_ID(GREATEST(fence + 1, " + now + "))," +
		" expires_us = " + now + " + ? WHERE lock_key = ? AND (token = '' OR expires_us <= " + now + ")" +
		" AND (" + q.queueHeadNowRaw(waiters, now) + ") = ?"
	q.renewHold = "UPDATE " + locks + " SET fence = LAST_INSERT_ID(fence + " + reserve + "), expires_us = " + now + " + ?" +
		" WHERE lock_key = ? AND token = ? AND holds = 1 AND expires_us > " + now
}

// commonQueries are the statements both dialects share.
func commonQueries(q *queries, t queryText) {
	locks, waiters, records, now, lockCols, recCols := t.locks, t.waiters, t.records, t.now, t.lockCols, t.recCols
	q.lockSelect = "SELECT " + lockCols + " FROM " + locks + " WHERE lock_key = ?"
	q.lockSelectForUpdate = q.lockSelect + " FOR UPDATE"
	q.lockUpdate = "UPDATE " + locks + " SET token = ?, owner = ?, holds = ?, fence = ?, expires_us = ? WHERE lock_key = ? AND token = ? AND fence = ?"
	q.queueHead = "SELECT waiter FROM " + waiters + " WHERE lock_key = ? AND expires_us > ? ORDER BY seq, waiter LIMIT 1"
	q.queueHeadNow = "SELECT waiter FROM " + waiters + " WHERE lock_key = ? AND expires_us > " + now + " ORDER BY seq, waiter LIMIT 1"
	q.peek = "SELECT (SELECT expires_us - " + now + " FROM " + locks + " WHERE lock_key = ? AND token <> '' AND expires_us > " + now + "), (" + q.queueHeadNow + ")," +
		" (SELECT COUNT(*) FROM " + waiters + " w WHERE w.lock_key = ? AND w.expires_us > " + now +
		" AND w.seq < (SELECT seq FROM " + waiters + " WHERE lock_key = ? AND waiter = ?))"
	q.notifyHead = "SELECT h.waiter, pg_notify(?, h.waiter) FROM (" + q.queueHeadNow + ") h"
	q.queueDelete = "DELETE FROM " + waiters + " WHERE lock_key = ? AND waiter = ?"
	q.queueCount = "SELECT COUNT(*) FROM " + waiters + " WHERE lock_key = ? AND expires_us > " + now
	q.recSelect = "SELECT " + recCols + " FROM " + records + " WHERE record_key = ?"
	q.recSelectForUpdate = q.recSelect + " FOR UPDATE"
	q.recUpdate = "UPDATE " + records + " SET state = ?, fingerprint = ?, token = ?, fence = ?, expires_us = ?, result = ?, attempt = ? WHERE record_key = ? AND token = ? AND fence = ?"
	q.recDelete = "DELETE FROM " + records + " WHERE record_key = ?"
	q.recList = "SELECT record_key FROM " + records + " WHERE record_key > ? AND state <> 0 ORDER BY record_key LIMIT 1000"
}

// queueHeadNowRaw is the statement that reads a key's first live waiter
// (its one parameter: the key).
func (q *queries) queueHeadNowRaw(waiters, now string) string {
	return "SELECT waiter FROM " + waiters + " WHERE lock_key = ? AND expires_us > " + now + " ORDER BY seq, waiter LIMIT 1"
}

// Rebind returns query with its ? placeholders numbered ($1, $2, ...) for
// PostgreSQL, and as it is for MySQL: for statements written once for
// both. A ? inside a string literal ('…', E'…', $tag$…$tag$), a quoted
// identifier or a comment is left as it is; ?? outside them stands for a
// literal ? (PostgreSQL's jsonb operators ?, ?| and ?& are written ??,
// ??| and ??&).
func (d Dialect) Rebind(query string) string {
	if d != Postgres {
		return query
	}
	return rebind(query)
}

// rebind numbers the ? placeholders of s ($1, $2, ...), skipping string
// literals, quoted identifiers and comments as PostgreSQL reads them, and
// turning ?? into ?. Text it cannot read to its end (an unclosed quote or
// comment) is copied as it is: the server reports the error.
func rebind(s string) string {
	if strings.IndexByte(s, '?') < 0 {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	n := 0
	for i := 0; i < len(s); {
		c := s[i]
		var end int // the end of a literal, identifier or comment starting at i
		switch {
		case c == '?' && i+1 < len(s) && s[i+1] == '?':
			b.WriteByte('?')
			i += 2
			continue
		case c == '?':
			n++
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(n))
			i++
			continue
		case c == '\'':
			// E'…' (or e'…') reads backslash escapes; '…' does not.
			escapes := i > 0 && (s[i-1] == 'E' || s[i-1] == 'e') && (i == 1 || !identChar(s[i-2]))
			end = quotedEnd(s, i, '\'', escapes)
		case c == '"':
			end = quotedEnd(s, i, '"', false)
		case c == '-' && i+1 < len(s) && s[i+1] == '-':
			end = strings.IndexByte(s[i:], '\n')
			if end < 0 {
				end = len(s)
			} else {
				end += i + 1
			}
		case c == '/' && i+1 < len(s) && s[i+1] == '*':
			end = blockCommentEnd(s, i)
		case c == '$' && (i == 0 || !identChar(s[i-1])):
			end = dollarQuotedEnd(s, i)
		}
		if end <= i {
			b.WriteByte(c)
			i++
			continue
		}
		b.WriteString(s[i:end])
		i = end
	}
	return b.String()
}

// identChar reports whether c may be part of an unquoted identifier (or a
// keyword, or a number): a quote or $ right after one does not start a
// literal of its own.
func identChar(c byte) bool {
	return c == '_' || c == '$' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= 0x80
}

// quotedEnd returns the end of the literal or identifier quoted by q that
// starts at i (a doubled q stands for one; with escapes, a backslash
// escapes the next byte), or len(s) when it is not closed.
func quotedEnd(s string, i int, q byte, escapes bool) int {
	for j := i + 1; j < len(s); j++ {
		switch s[j] {
		case '\\':
			if escapes {
				j++
			}
		case q:
			if j+1 < len(s) && s[j+1] == q {
				j++
				continue
			}
			return j + 1
		}
	}
	return len(s)
}

// blockCommentEnd returns the end of the /* … */ comment that starts at i
// (they nest in PostgreSQL), or len(s) when it is not closed.
func blockCommentEnd(s string, i int) int {
	depth := 0
	for j := i; j+1 < len(s); j++ {
		switch {
		case s[j] == '/' && s[j+1] == '*':
			depth++
			j++
		case s[j] == '*' && s[j+1] == '/':
			depth--
			j++
			if depth == 0 {
				return j + 1
			}
		}
	}
	return len(s)
}

// dollarQuotedEnd returns the end of the $tag$ … $tag$ literal that starts
// at i, i itself when no dollar quote starts there (a $1 parameter, a $
// inside an identifier), or len(s) when it is not closed.
func dollarQuotedEnd(s string, i int) int {
	j := i + 1
	for j < len(s) && s[j] != '$' {
		c := s[j]
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= 0x80 || j > i+1 && c >= '0' && c <= '9') {
			return i
		}
		j++
	}
	if j >= len(s) {
		return i
	}
	tag := s[i : j+1]
	k := strings.Index(s[j+1:], tag)
	if k < 0 {
		return len(s)
	}
	return j + 1 + k + len(tag)
}

// lockRow locks key's lock row in tx and reads it. With create, a missing
// row is created free (fence 0) so that it can be locked; without, a
// missing row reads as not found.
func (q *queries) lockRow(ctx context.Context, tx *sql.Tx, key string, create bool) (lockRow, error) {
	var r lockRow
	var row *sql.Row
	switch {
	case create && q.dialect == Postgres:
		row = tx.QueryRowContext(ctx, q.lockUpsert, []byte(key))
	case create:
		if _, err := tx.ExecContext(ctx, q.lockUpsert, []byte(key)); err != nil {
			return r, err
		}
		fallthrough
	default:
		row = tx.QueryRowContext(ctx, q.lockSelectForUpdate, []byte(key))
	}
	err := row.Scan(&r.token, &r.owner, &r.holds, &r.fence, &r.expires, &r.now)
	if errors.Is(err, sql.ErrNoRows) {
		return lockRow{}, nil
	}
	r.found = err == nil
	return r, err
}

// recordRow is lockRow for an idempotency record.
func (q *queries) recordRow(ctx context.Context, tx *sql.Tx, key string, create bool) (recordRow, error) {
	var r recordRow
	var row *sql.Row
	switch {
	case create && q.dialect == Postgres:
		row = tx.QueryRowContext(ctx, q.recUpsert, []byte(key))
	case create:
		if _, err := tx.ExecContext(ctx, q.recUpsert, []byte(key)); err != nil {
			return r, err
		}
		fallthrough
	default:
		row = tx.QueryRowContext(ctx, q.recSelectForUpdate, []byte(key))
	}
	err := row.Scan(&r.state, &r.fp, &r.token, &r.fence, &r.expires, &r.result, &r.attempt, &r.now)
	if errors.Is(err, sql.ErrNoRows) {
		return recordRow{}, nil
	}
	r.found = err == nil
	return r, err
}

// retryable reports a transaction the server aborted to break a deadlock
// or a serialization conflict: running it again is safe.
func retryable(err error) bool {
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return pg.Code == "40001" || pg.Code == "40P01" // serialization_failure, deadlock_detected
	}
	var my *mysql.MySQLError
	if errors.As(err, &my) {
		return my.Number == 1213 || my.Number == 1205 // deadlock, lock wait timeout
	}
	return false
}

// serverAnswer reports an error that is the database's answer to a
// statement (a constraint, a syntax error): asking again gets the same.
// Connection faults and timeouts are not answers.
func serverAnswer(err error) bool {
	var pg *pgconn.PgError
	var my *mysql.MySQLError
	return (errors.As(err, &pg) || errors.As(err, &my)) && !retryable(err) && !serverGoing(err)
}

// serverGoing reports an error the server sends as it drops the
// connection (PostgreSQL: a connection exception, or the server shutting
// down or crashing; MySQL: shutdown in progress): not an answer to the
// statement.
func serverGoing(err error) bool {
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return strings.HasPrefix(pg.Code, "08") || pg.Code == "57P01" || pg.Code == "57P02" || pg.Code == "57P03"
	}
	var my *mysql.MySQLError
	return errors.As(err, &my) && my.Number == 1053
}

// duplicateKey reports MySQL's refusal of an insert whose key is there.
func duplicateKey(err error) bool {
	var my *mysql.MySQLError
	return errors.As(err, &my) && my.Number == 1062
}

// myNoSuchIndex reports MySQL's refusal to drop an index that is not
// there (another process dropped it first).
func myNoSuchIndex(err error) bool {
	var my *mysql.MySQLError
	return errors.As(err, &my) && my.Number == 1091
}

// myDuplicateIndex reports MySQL's refusal to add an index that is
// there (another process added it first).
func myDuplicateIndex(err error) bool {
	var my *mysql.MySQLError
	return errors.As(err, &my) && my.Number == 1061
}

// myDuplicateColumn reports MySQL's refusal to add a column that is
// there (another process added it first).
func myDuplicateColumn(err error) bool {
	var my *mysql.MySQLError
	return errors.As(err, &my) && my.Number == 1060
}

// unsupported reports MySQL's refusal of a statement's syntax (1064) or
// of it in the prepared-statement protocol (1295).
func unsupported(err error) bool {
	var my *mysql.MySQLError
	return errors.As(err, &my) && (my.Number == 1064 || my.Number == 1295)
}

// missingTable reports the error of a statement on a table that does not
// exist: the schema was not migrated.
func missingTable(err error) bool {
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return pg.Code == "42P01" // undefined_table
	}
	var my *mysql.MySQLError
	return errors.As(err, &my) && my.Number == 1146
}

// fault reports an error of the connection rather than of the request: the
// request may or may not have reached the server.
func fault(err error) bool {
	var ne net.Error
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.As(err, &ne) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) || errors.Is(err, sql.ErrConnDone)
}

// connectionLost reports a fault of the way to the database, not the
// caller's context ending: no connection could be made, or the one in use
// failed or was cut (a server that crashed or restarted).
func connectionLost(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var ce *pgconn.ConnectError
	return fault(err) || serverGoing(err) || errors.As(err, &ce) || errors.Is(err, mysql.ErrInvalidConn) || errors.Is(err, driver.ErrBadConn)
}

// validPrefix reports whether p is a safe table prefix: letters, digits
// and underscores, optionally after one "schema." qualifier.
func validPrefix(p string) error {
	if p == "" || len(p) > 40 {
		return fmt.Errorf("sqlstore: table prefix %q: want 1 to 40 characters", p)
	}
	dots := 0
	for i, r := range p {
		switch {
		case r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z':
		case r >= '0' && r <= '9' && i > 0 && p[i-1] != '.':
		case r == '.' && i > 0 && dots == 0:
			dots++
		default:
			return fmt.Errorf("sqlstore: table prefix %q: only letters, digits, underscores and one schema qualifier", p)
		}
	}
	return nil
}
