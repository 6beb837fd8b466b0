package sqlstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"strings"
	"time"
)

// Cleanup deletes expired rows in batches (see WithCleanup) until a batch
// comes back short, and returns how many it deleted. Rows are deleted
// only once the server's clock has passed their fence, so a fence never
// goes backwards.
func (s *Store) Cleanup(ctx context.Context) (int64, error) {
	var total int64
	for i, stmt := range s.q.cleanup {
		for {
			res, err := s.cleanupStep(ctx, stmt)
			if err != nil {
				return total, s.errWrap("cleanup", "", err)
			}
			n, _ := res.RowsAffected()
			if i != 2 { // (the records' sweep_us set again, not deleted)
				total += n
			}
			if n < int64(s.cleanupBatch) {
				break
			}
		}
	}
	n, err := s.cleanupStock(ctx)
	return total + n, err
}

// cleanupStock deletes the stock records whose memory has passed (never
// one that still holds: its hold's end must find it).
func (s *Store) cleanupStock(ctx context.Context) (int64, error) {
	_, records := s.StockTables()
	now := "(" + nowUS(s.dialect) + " / 1000)"
	q := "DELETE FROM " + records + " WHERE until_ms < " + now + " AND state <> 2 LIMIT ?"
	if s.dialect == Postgres {
		q = "DELETE FROM " + records + " WHERE ctid IN (SELECT ctid FROM " + records + " WHERE until_ms < " + now +
			" AND state <> 2 LIMIT $1 FOR UPDATE SKIP LOCKED)"
	}
	var total int64
	for {
		res, err := s.db.ExecContext(ctx, q, s.cleanupBatch)
		if err != nil {
			if missingTable(err) {
				return total, nil // a schema applied before stock was kept
			}
			return total, s.errWrap("cleanup", "", err)
		}
		n, _ := res.RowsAffected()
		total += n
		if n < int64(s.cleanupBatch) {
			return total, nil
		}
	}
}

// cleanupStep runs one batch of a cleanup statement. MySQL's locks table
// has no index on its expiry, and a DELETE that scans it locks every row
// it passes (at REPEATABLE READ until it ends; READ COMMITTED does not
// spare a DELETE) and waits for any another statement holds: there the
// batch's keys are found by a read that takes no lock, and deleted by
// key, each row's expiry and fence checked again as the DELETE locks it.
// (PostgreSQL's statements skip locked rows: FOR UPDATE SKIP LOCKED.)
func (s *Store) cleanupStep(ctx context.Context, stmt string) (sql.Result, error) {
	if s.dialect != MySQL || stmt != s.q.cleanup[0] {
		return s.db.ExecContext(ctx, stmt, s.cleanupBatch)
	}
	rows, err := s.db.QueryContext(ctx, s.q.cleanupPick, s.cleanupBatch)
	if err != nil {
		return nil, err
	}
	var keys []any
	for rows.Next() {
		var k []byte
		if err := rows.Scan(&k); err != nil {
			_ = rows.Close()
			return nil, err
		}
		keys = append(keys, k)
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return nil, err
	}
	if len(keys) == 0 {
		return driver.RowsAffected(0), nil
	}
	res, err := s.db.ExecContext(ctx, s.q.cleanupByKey+" AND lock_key IN (?"+strings.Repeat(", ?", len(keys)-1)+")", keys...)
	if err != nil {
		return nil, err
	}
	if n, _ := res.RowsAffected(); n < int64(len(keys)) && len(keys) == s.cleanupBatch {
		// Rows taken meanwhile: a full batch still asks for the next one.
		return driver.RowsAffected(s.cleanupBatch), nil
	}
	return res, nil
}

// cleanupKey is the lock the cleanup loops of the Stores sharing the
// tables take in turn (its leading NUL keeps it apart from the keys
// applications choose, in practice).
const cleanupKey = "\x00oncekit:cleanup"

func (s *Store) cleanupLoop() {
	t := time.NewTicker(s.cleanupInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), s.cleanupInterval)
		var err error
		if ran, cerr := s.cleanupTurn(ctx); cerr != nil {
			err = cerr
		} else if ran {
			s.cleanups.Add(1)
			_, err = s.Cleanup(ctx)
		}
		cancel()
		if err != nil && s.onCleanupError != nil {
			s.onCleanupError(err)
		}
	}
}

// cleanupTurn takes the cleanup's turn for most of an interval, if no
// other Store on the tables took it: of the loops of N replicas, one
// cleans per interval rather than N (each a scan of the locks table).
// The turn is a lock on cleanupKey that is never released, only left to
// expire; it keeps no connection (not the server queue's statements).
func (s *Store) cleanupTurn(ctx context.Context) (bool, error) {
	g, err := s.attempt(ctx, cleanupKey, s.cleanupInterval*9/10, "", "", false)
	if err != nil {
		return false, err
	}
	return g.token != "", nil
}
