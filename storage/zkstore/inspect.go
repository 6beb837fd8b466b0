package zkstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/lock/lockdriver"
)

// InspectLock implements lock.Inspector. Waiters counts the acquisitions
// queued behind the holder; a free key reports the fence of its last
// acquisition while its directory lasts. The TTL is the holder's, from its
// node's last write by the servers' clock, read with this process's.
func (s *Store) InspectLock(ctx context.Context, key string) (lock.LockInfo, error) {
	if err := lockdriver.ValidateKey(key); err != nil {
		return lock.LockInfo{}, err
	}
	info, _, err := s.inspectLock(ctx, key)
	return info, err
}

func (s *Store) inspectLock(ctx context.Context, key string) (lock.LockInfo, string, error) {
	dir := s.lockDir(key)
	info := lock.LockInfo{Key: key}
	for range 8 {
		type res struct {
			kids []string
			st   *zk.Stat
		}
		r, err := call(ctx, s, func() (res, error) {
			kids, st, err := s.conn.Children(dir)
			return res{kids, st}, err
		}, nil)
		if errors.Is(err, zk.ErrNoNode) {
			return info, "", nil
		}
		if err != nil {
			return lock.LockInfo{}, "", fmt.Errorf("zkstore: inspect %q: %w", key, err)
		}
		kids := sortQueue(r.kids)
		if len(kids) == 0 {
			info.Fence = uint64(r.st.Mzxid)
			return info, "", nil
		}
		first := dir + "/" + kids[0]
		type got struct {
			data []byte
			st   *zk.Stat
		}
		g, err := call(ctx, s, func() (got, error) {
			d, st, err := s.conn.Get(first)
			return got{d, st}, err
		}, nil)
		if errors.Is(err, zk.ErrNoNode) {
			continue // released meanwhile
		}
		if err != nil {
			return lock.LockInfo{}, "", fmt.Errorf("zkstore: inspect %q: %w", key, err)
		}
		ttl, tok, ok := parseLockData(g.data)
		info.Held, info.Holds, info.Waiters, info.Fence = true, 1, len(kids)-1, uint64(g.st.Czxid)
		info.TTL = -1
		if ok {
			info.Token = lockdriver.TokenPrefix(tok)
			info.TTL = min(max(time.Until(time.UnixMilli(g.st.Mtime).Add(ttl)), time.Millisecond), ttl)
		} else {
			info.Detail = "the holder's node holds no oncekit data"
		}
		return info, first, nil
	}
	return lock.LockInfo{}, "", fmt.Errorf("zkstore: inspect %q: the queue kept changing", key)
}

// ForceRelease implements lock.Inspector: it deletes the holder's node,
// which wakes the next acquisition; the holder learns it lost the key at
// its next Refresh or Release (lock.ErrLockLost), or at once if it watches
// Done.
func (s *Store) ForceRelease(ctx context.Context, key string) (lock.LockInfo, error) {
	if err := lockdriver.ValidateKey(key); err != nil {
		return lock.LockInfo{}, err
	}
	info, node, err := s.inspectLock(ctx, key)
	if err != nil || !info.Held {
		return info, err
	}
	_, err = call(ctx, s, func() (struct{}, error) { return struct{}{}, s.conn.Delete(node, -1) }, nil)
	if err != nil && !errors.Is(err, zk.ErrNoNode) {
		return lock.LockInfo{}, fmt.Errorf("zkstore: force release %q: %w", key, err)
	}
	return info, nil
}

// InspectRecord implements idem.Inspector. A record whose lease or
// retention ended (by the servers' clock) is reported as not found, as a
// Begin would treat it.
func (s *Store) InspectRecord(ctx context.Context, key string) (idem.RecordInfo, error) {
	if err := lockdriver.ValidateKey(key); err != nil {
		return idem.RecordInfo{}, err
	}
	info := idem.RecordInfo{Key: key}
	rec, st, err := s.read(ctx, key, s.recordPath(key))
	var ce *idem.CorruptRecordError
	switch {
	case errors.Is(err, zk.ErrNoNode):
		return info, nil
	case errors.As(err, &ce):
		info.Found, info.Corrupt = true, ce.Reason
		return info, nil
	case err != nil:
		return idem.RecordInfo{}, fmt.Errorf("zkstore: inspect %q: %w", key, err)
	}
	exp := rec.expiresMs(st)
	if gone, err := s.expired(ctx, exp); err != nil {
		return idem.RecordInfo{}, fmt.Errorf("zkstore: inspect %q: %w", key, err)
	} else if gone {
		return info, nil
	}
	info.Found, info.Fingerprint, info.Fence, info.Expires = true, rec.fingerprint, rec.fenceOf(st), time.UnixMilli(exp)
	if rec.completed {
		info.State, info.Stored = idem.Completed, rec.result
	} else {
		info.State, info.Token = idem.InFlight, lockdriver.TokenPrefix(rec.token)
	}
	return info, nil
}

// DeleteRecord implements idem.Inspector: the next Begin of the key runs
// again, and an in-flight run's Complete fails with idem.ErrLockLost.
func (s *Store) DeleteRecord(ctx context.Context, key string) (bool, error) {
	if err := lockdriver.ValidateKey(key); err != nil {
		return false, err
	}
	_, err := call(ctx, s, func() (struct{}, error) { return struct{}{}, s.conn.Delete(s.recordPath(key), -1) }, nil)
	switch {
	case errors.Is(err, zk.ErrNoNode):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("zkstore: delete record %q: %w", key, err)
	}
	return true, nil
}

// Cleanup deletes the records whose lease or retention ended, by the
// servers' clock, one bucket directory at a time, each with a versioned
// delete (a record written meanwhile stays). It returns how many it
// deleted. Records that are not oncekit's are left to DeleteRecord.
func (s *Store) Cleanup(ctx context.Context) (int, error) {
	now, err := s.serverNow(ctx)
	if err != nil {
		return 0, fmt.Errorf("zkstore: cleanup: %w", err)
	}
	deleted := 0
	for b := range 256 {
		dir := fmt.Sprintf("%s/%02x", s.recordRoot(), b)
		kids, err := call(ctx, s, func() ([]string, error) {
			kids, _, err := s.conn.Children(dir)
			return kids, err
		}, nil)
		if errors.Is(err, zk.ErrNoNode) {
			continue
		}
		if err != nil {
			return deleted, fmt.Errorf("zkstore: cleanup: %w", err)
		}
		for _, k := range kids {
			path := dir + "/" + k
			key, _ := unescape(k)
			rec, st, err := s.read(ctx, key, path)
			if err != nil || rec.expiresMs(st) > now {
				continue
			}
			_, err = call(ctx, s, func() (struct{}, error) { return struct{}{}, s.conn.Delete(path, st.Version) }, nil)
			if err == nil {
				deleted++
			} else if ctx.Err() != nil {
				return deleted, fmt.Errorf("zkstore: cleanup: %w", ctx.Err())
			}
		}
	}
	return deleted, nil
}

func (s *Store) startCleanup(every time.Duration) {
	s.cleanupStop, s.cleanupDone = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(s.cleanupDone)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-s.cleanupStop:
				return
			case <-t.C:
			}
			ctx, cancel := context.WithTimeout(context.Background(), every)
			_, _ = s.Cleanup(ctx)
			cancel()
		}
	}()
}

func (s *Store) stopCleanup() {
	if s.cleanupStop != nil {
		close(s.cleanupStop)
		<-s.cleanupDone
	}
}

var (
	_ lock.Inspector = (*Store)(nil)
	_ idem.Inspector = (*Store)(nil)
)
