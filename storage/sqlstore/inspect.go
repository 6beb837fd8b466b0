package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/lock/lockdriver"
)

// InspectLock implements lockdriver.Inspector. Waiters counts the processes in
// Acquire: the sessions the server queues for the key's session lock, and
// the live entries of the key's queue table (waiters that poll).
func (s *Store) InspectLock(ctx context.Context, key string) (lockdriver.LockInfo, error) {
	if err := lockdriver.ValidateKey(key); err != nil {
		return lockdriver.LockInfo{}, err
	}
	var r lockRow
	err := s.queryRow(ctx, s.q.lockSelect, []byte(key)).Scan(&r.token, &r.owner, &r.holds, &r.fence, &r.expires, &r.now)
	r.found = err == nil
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return lockdriver.LockInfo{}, s.errWrap("inspect", key, err)
	}
	info := lockInfo(key, r)
	if err := s.queryRow(ctx, s.q.queueCount, []byte(key)).Scan(&info.Waiters); err != nil {
		return lockdriver.LockInfo{}, s.errWrap("inspect", key, err)
	}
	if s.sessionQueue {
		n, err := s.sessionWaiters(ctx, key)
		if err != nil {
			return lockdriver.LockInfo{}, s.errWrap("inspect", key, err)
		}
		info.Waiters += n
	}
	return info, nil
}

func lockInfo(key string, r lockRow) lockdriver.LockInfo {
	info := lockdriver.LockInfo{Key: key}
	if r.held() {
		info.Held, info.Token, info.Owner, info.Holds = true, lockdriver.TokenPrefix(r.token), string(r.owner), r.holds
		info.Fence, info.TTL = uint64(r.fence), time.Duration(r.expires-r.now)*time.Microsecond
	}
	return info
}

// ForceRelease implements lockdriver.Inspector: the key is freed and its waiters
// woken; the holder learns at its next Refresh or Release that it lost
// the key (lock.ErrLockLost).
func (s *Store) ForceRelease(ctx context.Context, key string) (lockdriver.LockInfo, error) {
	if err := lockdriver.ValidateKey(key); err != nil {
		return lockdriver.LockInfo{}, err
	}
	var info lockdriver.LockInfo
	var head string
	err := s.inTx(ctx, "force release", key, func(tx *sql.Tx) error {
		r, err := s.q.lockRow(ctx, tx, key, false)
		if err != nil {
			return err
		}
		info = lockInfo(key, r)
		if !info.Held {
			return nil
		}
		if s.sessionQueue {
			// Freed as long ago as a stopped holder's row: the holder's
			// connection keeps the key's session lock until it learns, and
			// acquirers take such a row without it.
			r.now -= us(s.stuckAfter())
		}
		head, err = s.freeLock(ctx, tx, key, r)
		return err
	})
	if err != nil {
		return lockdriver.LockInfo{}, err
	}
	s.wakeWaiter(head)
	return info, nil
}

// InspectRecord implements idemdriver.Inspector.
func (s *Store) InspectRecord(ctx context.Context, key string) (idemdriver.RecordInfo, error) {
	if err := lockdriver.ValidateKey(key); err != nil {
		return idemdriver.RecordInfo{}, err
	}
	var r recordRow
	err := s.queryRow(ctx, s.q.recSelect, []byte(key)).Scan(&r.state, &r.fp, &r.token, &r.fence, &r.expires, &r.result, &r.attempt, &r.now)
	r.found = err == nil
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return idemdriver.RecordInfo{}, s.errWrap("inspect", key, err)
	}
	info := idemdriver.RecordInfo{Key: key}
	if reason := r.corrupt(); reason != "" {
		info.Found, info.Corrupt, info.Fence = true, reason, uint64(max(r.fence, 0))
		return info, nil
	}
	if !r.live() {
		return info, nil
	}
	info.Found, info.Fingerprint, info.Fence = true, string(r.fp), uint64(r.fence)
	info.Expires = time.Now().Add(r.remaining())
	if r.state == stateCompleted {
		info.State, info.Stored = idemdriver.Completed, r.result
	} else {
		info.State, info.Token = idemdriver.InFlight, lockdriver.TokenPrefix(r.token)
	}
	return info, nil
}

// DeleteRecord implements idemdriver.Inspector.
func (s *Store) DeleteRecord(ctx context.Context, key string) (bool, error) {
	if err := lockdriver.ValidateKey(key); err != nil {
		return false, err
	}
	found := false
	err := s.inTx(ctx, "delete record", key, func(tx *sql.Tx) error {
		r, err := s.q.recordRow(ctx, tx, key, false)
		if err != nil {
			return err
		}
		if found = r.live() || r.corrupt() != ""; !found {
			return nil
		}
		return s.freeRecord(ctx, tx, key, r)
	})
	if err == nil && found {
		s.local.drop(key) // a claim of this Store's no longer holds the key
		s.wakeRecord(key)
	}
	return found, err
}

var (
	_ lockdriver.Inspector = (*Store)(nil)
	_ idemdriver.Inspector = (*Store)(nil)
)

// ListKeys implements idemdriver.Lister: the records table in key order, 1000
// rows a page (rows left free by an abandoned claim are not records).
func (s *Store) ListKeys(ctx context.Context, fn func(key string) bool) error {
	after := []byte{}
	for {
		rows, err := s.db.QueryContext(ctx, s.q.recList, after)
		if err != nil {
			return fmt.Errorf("sqlstore: list records: %w", err)
		}
		var keys [][]byte
		for rows.Next() {
			var k []byte
			if err := rows.Scan(&k); err != nil {
				rows.Close()
				return fmt.Errorf("sqlstore: list records: %w", err)
			}
			keys = append(keys, k)
		}
		err = rows.Err()
		rows.Close()
		if err != nil {
			return fmt.Errorf("sqlstore: list records: %w", err)
		}
		for _, k := range keys {
			if !fn(string(k)) {
				return nil
			}
		}
		if len(keys) < 1000 {
			return nil
		}
		after = keys[len(keys)-1]
	}
}
