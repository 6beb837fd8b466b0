package sqlstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemdriver"
)

// Effect is a write in the database that commits atomically with an
// idempotency record: the Store runs it in the transaction that completes
// the record — first the statement that checks that the claim is still the
// caller's and completes the record (a claim lost is lock.ErrLockLost, and
// the effect does not run), then the effect, then the commit — so the
// order, the stock and the outbox row are written together with the record
// or not at all — by construction, not by care: a process killed anywhere
// in between leaves the transaction uncommitted, and the retry runs again.
// The effect's row locks (a SKU's stock row, shared by every buyer) are
// held from its writes to the commit: one round trip.
//
// The effect returns nil to go ahead. Any other error rolls everything
// back: a database's own answer (a constraint, a syntax error) is an
// idem.ErrEffectFailed, a lost connection or an expired context is a
// fault the Guard retries, and an error of the effect's own (too little
// stock, say) is an idem.ErrEffectRefused whose reason is the error's
// message. The effect must not commit or roll back tx. Pass it to
// idem.Commit in a Guard's run (or httpmw.Commit in a handler).
type Effect func(ctx context.Context, tx *sql.Tx) error

// CompleteWith implements idemdriver.EffectStore: effect is an Effect (or a
// func(context.Context, *sql.Tx) error), run in a transaction of the
// Store's; Writes, on PostgreSQL one statement with the completion; or
// InTx(tx), the caller's own transaction.
func (s *Store) CompleteWith(ctx context.Context, c idemdriver.Claim, result []byte, retention time.Duration, effect any) error {
	defer s.finished(c)
	if own, isTx := effect.(txEffect); isTx {
		if own.tx == nil {
			return fmt.Errorf("sqlstore: complete %q: InTx(nil): %w", c.Key, idem.ErrEffectUnsupported)
		}
		return s.CompleteInTx(ctx, own.tx, c, result, retention)
	}
	if w, isWrites := effect.(Writes); isWrites {
		return s.completeWrites(ctx, c, result, retention, w)
	}
	e, ok := effect.(Effect)
	if f, isFunc := effect.(func(context.Context, *sql.Tx) error); isFunc {
		e, ok = f, true
	}
	if !ok || e == nil {
		return fmt.Errorf("sqlstore: complete %q: %T is not a sqlstore.Effect: %w", c.Key, effect, idem.ErrEffectUnsupported)
	}
	return s.complete(ctx, c, result, retention, e)
}

// txEffect is InTx's effect.
type txEffect struct{ tx *sql.Tx }

// CallerCommits implements idemdriver.CallerCommits: the caller commits tx.
func (txEffect) CallerCommits() {}

// InTx is an effect for idem.Commit when the caller's
// framework owns the transaction the run writes in: the Guard completes
// the record inside tx when the run returns, and the caller commits tx
// after Guard.Do returns — the record is completed if, and only if, tx
// commits. A tx rolled back leaves the claim in flight until its lease
// runs out; the retry then runs again. Until tx ends, a duplicate's Begin
// waits on the record's row lock. tx must be a transaction on the Store's
// database.
//
// Not under httpmw, grpcmw or kafkamw, which answer as soon as Guard.Do
// returns, before the caller could commit: Commit refuses it there
// (idem.ErrCallerCommits); use Effect, which the Store commits with the
// record before the answer is released.
func InTx(tx *sql.Tx) any { return txEffect{tx} }

// CompleteInTx completes c's record inside tx, a transaction the caller
// owns and commits: for code that calls Begin itself and writes its
// business rows in its own transaction. It locks the record's row and
// checks that c still holds it (else lock.ErrLockLost, and the caller must
// roll back). The record is completed when — and only if — tx commits.
// tx must be a transaction on the Store's database. On PostgreSQL, waiters
// are notified at the commit; on MySQL they notice at their next poll.
func (s *Store) CompleteInTx(ctx context.Context, tx *sql.Tx, c idemdriver.Claim, result []byte, retention time.Duration) error {
	defer s.finished(c) // (a duplicate woken now waits for tx on the record's row)
	if err := s.fits(c, result); err != nil {
		return err
	}
	if err := s.completeTx(ctx, tx, c, result, retention, nil); err != nil {
		var st stopErr
		if errors.As(err, &st) {
			return st.err
		}
		var pg *pgconn.PgError
		if errors.As(err, &pg) && pg.Code == "40001" {
			// The caller's transaction reads a snapshot older than the
			// claim's last write (an Extend by the watchdog): at REPEATABLE
			// READ or SERIALIZABLE it can never complete the claim.
			return fmt.Errorf("sqlstore: complete %q in the caller's transaction: %w; a transaction at REPEATABLE READ or SERIALIZABLE cannot complete a claim written after its snapshot (the watchdog extends claims while they run): begin it at READ COMMITTED (sql.TxOptions{Isolation: sql.LevelReadCommitted})",
				c.Key, err)
		}
		return s.errWrap("complete", c.Key.String(), err)
	}
	return nil
}

// effectError sorts an effect's error (see Effect). An error of the
// effect's own is a refusal only if its transaction still works: an effect
// that reports a lost connection in words of its own is still a fault.
func effectError(ctx context.Context, tx *sql.Tx, key string, err error) error {
	var refused *idem.EffectRefusedError
	switch {
	case errors.As(err, &refused):
		return stop(err)
	case retryable(err):
		return err // the whole transaction runs again
	case serverAnswer(err):
		return stop(&idem.EffectFailedError{Key: key, Err: err})
	case fault(err) || serverGoing(err) || errors.Is(err, driver.ErrBadConn):
		return err
	}
	if _, probe := tx.ExecContext(ctx, "SELECT 1"); probe != nil && !serverAnswer(probe) {
		return errors.Join(err, probe)
	}
	return stop(&idem.EffectRefusedError{Key: key, Reason: err.Error()})
}
