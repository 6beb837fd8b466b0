package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/lock"
)

// Writes is an effect made of SQL writes — INSERT, UPDATE or DELETE
// statements — that commit with the record, as an Effect does, for a
// Guard run's idem.Commit. On PostgreSQL the Store sends the writes and
// the record's completion as one statement (each write a query of its
// WITH clause), in autocommit: the rows they lock are held while that
// statement runs and never across a round trip to the client. That is
// the way to write a row every request shares — a SKU's stock in a flash
// sale — where an Effect's transaction holds the row's lock from its
// write to the commit, a round trip through a busy client. On MySQL, which
// has no writes in WITH, they run one after another in the transaction
// that completes the record, as an Effect's — on MariaDB in one round
// trip: the transaction, the record's completion and the writes are one
// compound statement (BEGIN NOT ATOMIC … END, prepared on the connections
// of Open's *sql.DB), so that a row every request writes is locked from
// its write to the commit without a round trip to the client between
// them; on MySQL 8, which runs compound statements only inside stored
// programs, as statements of their own.
//
// A write with Refuse set must change at least one row: if it changes
// none (too little stock, say), nothing is written, the record is not
// completed and the effect is refused (idem.ErrEffectRefused, with Refuse
// as the reason). As with an Effect, a claim lost before the statement
// is lock.ErrLockLost and nothing is written; a database's own answer (a
// constraint, a syntax error) is idem.ErrEffectFailed. The writes of one
// statement see the rows as they were before it (PostgreSQL's rule for
// writes in WITH): two writes must not change the same row.
type Writes []Write

// Write is one statement of Writes: Query with ? placeholders, without a
// RETURNING clause, and its Args. On PostgreSQL the Store numbers the
// placeholders (Dialect.Rebind): a ? inside a string literal, a quoted
// identifier or a comment is text, and ?? stands for the ? operator
// (jsonb's ?, ?| and ?& are written ??, ??| and ??&).
type Write struct {
	Query  string
	Args   []any
	Refuse string // when not "": the effect is refused, with this reason, unless the write changes a row
}

// check refuses Writes the Store cannot send.
func (w Writes) check(key string) error {
	if len(w) == 0 {
		return fmt.Errorf("sqlstore: complete %q: Writes without a write: %w", key, idem.ErrEffectUnsupported)
	}
	for i, x := range w {
		if strings.TrimSpace(x.Query) == "" {
			return fmt.Errorf("sqlstore: complete %q: write %d has no query: %w", key, i, idem.ErrEffectUnsupported)
		}
	}
	return nil
}

// effect is w as an Effect: the writes one after another in tx.
func (w Writes) effect(d Dialect) Effect {
	return func(ctx context.Context, tx *sql.Tx) error {
		for _, x := range w {
			res, err := tx.ExecContext(ctx, d.Rebind(x.Query), x.Args...)
			if err != nil {
				return err
			}
			if x.Refuse == "" {
				continue
			}
			if n, err := res.RowsAffected(); err != nil {
				return err
			} else if n == 0 {
				return refusal{x.Refuse}
			}
		}
		return nil
	}
}

// refusal is a Write's Refuse as an Effect's own error.
type refusal struct{ reason string }

func (r refusal) Error() string { return r.reason }

// The markers by which the statement of Writes says why it stopped: on
// PostgreSQL the text of a cast to integer that fails, which rolls the
// statement back; on MariaDB a SIGNAL's message.
const (
	writesLost    = "oncekit:lost"
	writesRefused = "oncekit:refused:"
)

// completeWrites completes c with w (see Writes).
func (s *Store) completeWrites(ctx context.Context, c idemdriver.Claim, result []byte, retention time.Duration, w Writes) error {
	key := c.Key.String()
	if err := w.check(key); err != nil {
		return err
	}
	if s.dialect != Postgres {
		// (returning: MariaDB 10.5 or later, which runs compound
		// statements outside stored programs; MySQL 8 does not.)
		if !s.returning(ctx) {
			return s.complete(ctx, c, result, retention, w.effect(s.dialect))
		}
		return s.completeCompound(ctx, c, result, retention, w)
	}
	if err := s.completing(c, result, retention); err != nil {
		return err
	}
	if result == nil {
		result = []byte{}
	}
	query, args := s.writesStatement(key, c.Token, result, retention, w)
	var stop int64
	var watched bool
	err := s.queryRow(ctx, query, args...).Scan(&stop, &watched)
	if err != nil {
		return s.writesFailed(ctx, c, result, retention, w, err)
	}
	if watched {
		// A duplicate in another process waits for the record: it is
		// told by a statement of its own, as after a plain completion.
		// (NOTIFY serialises the commits of every transaction that sends
		// one: in the writes' statement it would keep their rows locked
		// while it waits for its turn.)
		_, _, records := s.Tables()
		_ = s.queryRow(ctx, s.q.notifyWatched, records, keyHash(key)).Scan(new(sql.NullString))
	}
	s.wakeRecord(key)
	return nil
}

// writesFailed sorts the error of a statement of Writes
// (completeWrites, completeCompound).
func (s *Store) writesFailed(ctx context.Context, c idemdriver.Claim, result []byte, retention time.Duration, w Writes, err error) error {
	key := c.Key.String()
	// The statement stopped itself: on PostgreSQL by a cast that failed,
	// on MariaDB by a SIGNAL; the message says why.
	var stopped string
	var pg *pgconn.PgError
	var my *mysql.MySQLError
	switch {
	case errors.As(err, &pg) && pg.Code == "22P02":
		stopped = pg.Message
	case errors.As(err, &my) && my.Number == mysqlSignal:
		stopped = my.Message
	}
	switch {
	case strings.Contains(stopped, writesLost):
		return fmt.Errorf("sqlstore: complete %q: %w", c.Key, lock.ErrLockLost)
	case strings.Contains(stopped, writesRefused):
		if i, ok := refusedWrite(stopped); ok && i < len(w) {
			return &idem.EffectRefusedError{Key: key, Reason: w[i].Refuse}
		}
		return s.errWrap("complete", key, err)
	case retryable(err):
		// A serialization failure (sessions at REPEATABLE READ), a
		// deadlock or a lock wait that timed out, and nothing written:
		// the writes in the Store's transaction (at READ COMMITTED on
		// PostgreSQL), which asks again.
		return s.complete(ctx, c, result, retention, w.effect(s.dialect))
	case serverAnswer(err):
		return &idem.EffectFailedError{Key: key, Err: err}
	}
	return s.errWrap("complete", key, err)
}

// completeCompound completes c with w in one MariaDB compound statement
// (compoundStatement).
func (s *Store) completeCompound(ctx context.Context, c idemdriver.Claim, result []byte, retention time.Duration, w Writes) error {
	key := c.Key.String()
	if err := s.completing(c, result, retention); err != nil {
		return err
	}
	if result == nil {
		result = []byte{}
	}
	query, args := s.compoundStatement(key, c.Token, result, retention, w)
	if _, err := s.exec(ctx, query, args...); err != nil {
		return s.writesFailed(ctx, c, result, retention, w, err)
	}
	s.wakeRecord(key)
	return nil
}

// mysqlSignal is MySQL's error number for an error raised by SIGNAL
// (ER_SIGNAL_EXCEPTION).
const mysqlSignal = 1644

// compoundStatement is completeCompound's statement: a transaction in
// which the record's completion and then each write runs, and which is
// rolled back — by the handler every error of the block reaches — when
// the completion changes no row (the claim is not the record's) or a
// write with Refuse changes none; the SIGNAL's message names which, as
// writesStatement's cast does on PostgreSQL. The transaction is MySQL's
// default, as the Store's own are.
func (s *Store) compoundStatement(key, tok string, result []byte, retention time.Duration, w Writes) (string, []any) {
	var b strings.Builder
	b.WriteString("BEGIN NOT ATOMIC DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END; START TRANSACTION; ")
	b.WriteString(s.q.myComplete)
	b.WriteString("; IF ROW_COUNT() <> 1 THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '" + writesLost + "'; END IF;")
	args := []any{us(retention), result, []byte(key), tok}
	for i, x := range w {
		// (On lines of their own: a write may end in a -- comment.)
		b.WriteString("\n" + strings.TrimRight(strings.TrimSpace(x.Query), ";") + "\n;")
		if x.Refuse != "" {
			fmt.Fprintf(&b, " IF ROW_COUNT() = 0 THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '%s%d'; END IF;", writesRefused, i)
		}
		args = append(args, x.Args...)
	}
	b.WriteString(" COMMIT; END")
	return b.String(), args
}

// refusedWrite reads the index of the refusing write from the message of
// the failed cast ("…: \"oncekit:refused:2\"").
func refusedWrite(msg string) (int, bool) {
	rest := msg[strings.Index(msg, writesRefused)+len(writesRefused):]
	end := 0
	for end < len(rest) && rest[end] >= '0' && rest[end] <= '9' {
		end++
	}
	i, err := strconv.Atoi(rest[:end])
	return i, err == nil
}

// writesStatement is the one statement of completeWrites: the record's
// completion and the writes, each a query of its WITH clause, then a
// cast that fails — rolling everything back — when the claim was not the
// record's or a write with Refuse changed no row; and whether a duplicate
// watches the record, to be notified after the commit.
func (s *Store) writesStatement(key, tok string, result []byte, retention time.Duration, w Writes) (string, []any) {
	_, _, records := s.Tables()
	now := nowUS(s.dialect)
	var b strings.Builder
	b.WriteString("WITH c AS (UPDATE " + records + " SET state = 2, token = '', expires_us = " + now + " + ?, result = ?" +
		" WHERE record_key = ? AND state = 1 AND token = ? AND expires_us > " + now + " RETURNING watched)")
	args := []any{us(retention), result, []byte(key), tok}
	for i, x := range w {
		fmt.Fprintf(&b, ", w%d AS (%s RETURNING 1)", i, strings.TrimRight(strings.TrimSpace(x.Query), ";"))
		args = append(args, x.Args...)
	}
	b.WriteString(" SELECT CAST(CASE WHEN NOT EXISTS (SELECT 1 FROM c) THEN '" + writesLost + "'")
	for i, x := range w {
		if x.Refuse != "" {
			fmt.Fprintf(&b, " WHEN NOT EXISTS (SELECT 1 FROM w%d) THEN '%s%d'", i, writesRefused, i)
		}
	}
	b.WriteString(" ELSE '0' END AS integer), EXISTS (SELECT 1 FROM c WHERE watched)")
	return rebind(b.String()), args
}
