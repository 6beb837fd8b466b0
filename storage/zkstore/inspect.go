package zkstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/lock/lockdriver"
)

// InspectLock implements lockdriver.Inspector. Waiters counts the acquisitions
// queued behind the holder; a free key reports the fence of its last
// acquisition while its directory lasts. The TTL is the holder's, from its
// node's last write by the servers' clock, read with this process's.
func (s *Store) InspectLock(ctx context.Context, key string) (lockdriver.LockInfo, error) {
	if err := lockdriver.ValidateKey(key); err != nil {
		return lockdriver.LockInfo{}, err
	}
	if err := s.syncPath(ctx, s.lockDir(key)); err != nil {
		return lockdriver.LockInfo{}, fmt.Errorf("zkstore: inspect %q: %w", key, err)
	}
	info, _, err := s.inspectLock(ctx, key)
	return info, err
}

// syncPath has this session's server catch up with the leader before an
// operator's read (another session's writes acknowledged before it was
// asked are then seen): ZooKeeper serves reads from the server a session
// is connected to, which may lag.
func (s *Store) syncPath(ctx context.Context, path string) error {
	_, err := call(ctx, s, func() (string, error) { return s.conn.Sync(path) }, nil)
	if errors.Is(err, zk.ErrNoNode) {
		return nil
	}
	return err
}

// inspectLock also returns the holder's nodes (its queue node and its
// re-entry nodes).
func (s *Store) inspectLock(ctx context.Context, key string) (lockdriver.LockInfo, []string, error) {
	dir := s.lockDir(key)
	info := lockdriver.LockInfo{Key: key}
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
			return info, nil, nil
		}
		if err != nil {
			return lockdriver.LockInfo{}, nil, fmt.Errorf("zkstore: inspect %q: %w", key, err)
		}
		sn := snapshotOf(r.kids)
		first, group := sn.holders()
		if first == "" {
			info.Fence = uint64(r.st.Mzxid)
			info.Waiters = len(sn.queue)
			return info, nil, nil
		}
		h, st, err := s.getLock(ctx, dir+"/"+first)
		if errors.Is(err, zk.ErrNoNode) {
			continue // released meanwhile
		}
		info.Held, info.Holds, info.TTL = true, len(group), -1
		info.Waiters = len(sn.queue)
		if !strings.HasPrefix(first, holdPrefix) {
			info.Waiters-- // the holder's queue node
		}
		nodes := make([]string, len(group))
		for i, n := range group {
			nodes[i] = dir + "/" + n
		}
		if err != nil {
			if st == nil {
				return lockdriver.LockInfo{}, nil, fmt.Errorf("zkstore: inspect %q: %w", key, err)
			}
			info.Detail = "the holder's node holds no oncekit data"
			info.Fence = uint64(st.Czxid)
			return info, nodes, nil
		}
		info.Token, info.Owner, info.TTL, info.Fence = lockdriver.TokenPrefix(h.token), h.owner, h.remaining(st), h.fence
		if info.Fence == 0 {
			info.Fence = uint64(st.Czxid)
		}
		if info.Owner == "" {
			info.Holds = 1
		}
		return info, nodes, nil
	}
	return lockdriver.LockInfo{}, nil, fmt.Errorf("zkstore: inspect %q: the queue kept changing", key)
}

// ForceRelease implements lockdriver.Inspector: it deletes the holder's nodes,
// which wakes the next acquisition; the holder learns it lost the key at
// its next Refresh or Release (lock.ErrLockLost), or at once if it watches
// Done.
func (s *Store) ForceRelease(ctx context.Context, key string) (lockdriver.LockInfo, error) {
	if err := lockdriver.ValidateKey(key); err != nil {
		return lockdriver.LockInfo{}, err
	}
	info, nodes, err := s.inspectLock(ctx, key)
	if err != nil || !info.Held {
		return info, err
	}
	for _, node := range nodes {
		_, err = call(ctx, s, func() (struct{}, error) { return struct{}{}, s.conn.Delete(node, -1) }, nil)
		if err != nil && !errors.Is(err, zk.ErrNoNode) {
			return lockdriver.LockInfo{}, fmt.Errorf("zkstore: force release %q: %w", key, err)
		}
	}
	return info, nil
}

// InspectRecord implements idemdriver.Inspector. A record whose lease or
// retention ended (by the servers' clock) is reported as not found, as a
// Begin would treat it.
func (s *Store) InspectRecord(ctx context.Context, key string) (idemdriver.RecordInfo, error) {
	if err := lockdriver.ValidateKey(key); err != nil {
		return idemdriver.RecordInfo{}, err
	}
	info := idemdriver.RecordInfo{Key: key}
	path := s.recordPath(key)
	if err := s.syncPath(ctx, path); err != nil {
		return idemdriver.RecordInfo{}, fmt.Errorf("zkstore: inspect %q: %w", key, err)
	}
	rec, st, err := s.read(ctx, key, path)
	_, reason, corrupt := idemdriver.CorruptRecordOf(err)
	switch {
	case errors.Is(err, zk.ErrNoNode):
		return info, nil
	case corrupt:
		info.Found, info.Corrupt = true, reason
		return info, nil
	case err != nil:
		return idemdriver.RecordInfo{}, fmt.Errorf("zkstore: inspect %q: %w", key, err)
	}
	exp := rec.expiresMs(st)
	if v, err := s.expired(ctx, exp, st); err != nil {
		return idemdriver.RecordInfo{}, fmt.Errorf("zkstore: inspect %q: %w", key, err)
	} else if v == ended || rec.abandoned {
		return info, nil
	}
	info.Found, info.Fingerprint, info.Fence, info.Expires = true, rec.fingerprint, rec.fenceOf(st), time.UnixMilli(exp)
	if rec.completed {
		info.State, info.Stored = idemdriver.Completed, rec.result
	} else {
		info.State, info.Token = idemdriver.InFlight, lockdriver.TokenPrefix(rec.token)
	}
	return info, nil
}

// DeleteRecord implements idemdriver.Inspector: the next Begin of the key runs
// again, and an in-flight run's Complete fails with lock.ErrLockLost.
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

// Cleanup deletes the records whose retention ended, and those of claims
// that ended without completing idem.AttemptMemory ago, by the servers'
// clock, one bucket directory at a time, each with a versioned
// delete (a record written meanwhile stays). It returns how many it
// deleted. Records that are not oncekit's are left to DeleteRecord.
func (s *Store) Cleanup(ctx context.Context) (int, error) {
	now, err := s.serverNow(ctx)
	if err != nil {
		return 0, fmt.Errorf("zkstore: cleanup: %w", err)
	}
	deleted := 0
	err = s.eachRecord(ctx, func(path, key string) (bool, error) {
		rec, st, err := s.read(ctx, key, path)
		if err != nil {
			return true, nil
		}
		switch judge(rec.forgottenMs(st), st, now) {
		case live:
			return true, nil
		case restamp: // stamped by an earlier leader: judged at a later cleanup
			_, _ = s.restampRecord(ctx, path, rec, st)
			return true, ctx.Err()
		}
		_, err = call(ctx, s, func() (struct{}, error) { return struct{}{}, s.conn.Delete(path, st.Version) }, nil)
		if err == nil {
			deleted++
		}
		return true, ctx.Err()
	})
	if err != nil {
		return deleted, fmt.Errorf("zkstore: cleanup: %w", err)
	}
	n, err := s.cleanupStock(ctx, now)
	if err != nil {
		return deleted + n, fmt.Errorf("zkstore: cleanup: %w", err)
	}
	return deleted + n, nil
}

// eachRecord calls fn with the path and key of every record node, one
// bucket directory at a time, until fn returns false or an error.
func (s *Store) eachRecord(ctx context.Context, fn func(path, key string) (bool, error)) error {
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
			return err
		}
		for _, k := range kids {
			key, ok := unescape(k)
			if !ok {
				continue
			}
			if more, err := fn(dir+"/"+k, key); !more || err != nil {
				return err
			}
		}
	}
	return nil
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
	_ lockdriver.Inspector = (*Store)(nil)
	_ idemdriver.Inspector = (*Store)(nil)
)

// ListKeys implements idemdriver.Lister: the children of the 256 record
// directories.
func (s *Store) ListKeys(ctx context.Context, fn func(key string) bool) error {
	if err := s.eachRecord(ctx, func(_, key string) (bool, error) { return fn(key), nil }); err != nil {
		return fmt.Errorf("zkstore: list records: %w", err)
	}
	return nil
}
