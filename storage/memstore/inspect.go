package memstore

import (
	"context"
	"time"

	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/lock/lockdriver"
)

// InspectLock implements lockdriver.Inspector. Waiters counts the goroutines
// queued for the key. A free key reports fence 0: the Store's fence counter
// is shared by all keys.
func (s *Store) InspectLock(_ context.Context, key string) (lockdriver.LockInfo, error) {
	if err := lockdriver.ValidateKey(key); err != nil {
		return lockdriver.LockInfo{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inspectLocked(key), nil
}

func (s *Store) inspectLocked(key string) lockdriver.LockInfo {
	info := lockdriver.LockInfo{Key: key}
	e := s.locks[key]
	if e == nil {
		return info
	}
	info.Waiters = e.waiters.Len()
	if g := e.holder; g != nil && g.heldLocked() {
		info.Held, info.Token, info.Owner, info.Holds = true, lockdriver.TokenPrefix(g.token), g.owner, g.holds
		info.Fence, info.TTL = g.fence, time.Until(g.expires)
	}
	return info
}

// ForceRelease implements lockdriver.Inspector: the holder's leases end as lost
// (Done closes) and the first waiter gets the key.
func (s *Store) ForceRelease(_ context.Context, key string) (lockdriver.LockInfo, error) {
	if err := lockdriver.ValidateKey(key); err != nil {
		return lockdriver.LockInfo{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	info := s.inspectLocked(key)
	if info.Held {
		s.loseLocked(s.locks[key].holder)
	}
	return info, nil
}

// InspectRecord implements idemdriver.Inspector.
func (s *Store) InspectRecord(_ context.Context, key string) (idemdriver.RecordInfo, error) {
	if err := lockdriver.ValidateKey(key); err != nil {
		return idemdriver.RecordInfo{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.recordLocked(key)
	if r == nil {
		return idemdriver.RecordInfo{Key: key}, nil
	}
	info := idemdriver.RecordInfo{Key: key, Found: true, State: idemdriver.InFlight, Fingerprint: r.fp,
		Token: lockdriver.TokenPrefix(r.token), Fence: r.fence, Expires: r.expires}
	if r.done {
		info.State, info.Token, info.Stored = idemdriver.Completed, "", append([]byte(nil), r.result...)
	}
	return info, nil
}

// DeleteRecord implements idemdriver.Inspector.
func (s *Store) DeleteRecord(_ context.Context, key string) (bool, error) {
	if err := lockdriver.ValidateKey(key); err != nil {
		return false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.recordLocked(key)
	if r == nil {
		return false, nil
	}
	s.dropRecordLocked(key, r)
	return true, nil
}

var (
	_ lockdriver.Inspector = (*Store)(nil)
	_ idemdriver.Inspector = (*Store)(nil)
)

// ListKeys implements idemdriver.Lister.
func (s *Store) ListKeys(ctx context.Context, fn func(key string) bool) error {
	s.mu.Lock()
	keys := make([]string, 0, len(s.records))
	for k := range s.records {
		keys = append(keys, k)
	}
	s.mu.Unlock()
	for _, k := range keys {
		if err := ctx.Err(); err != nil {
			return err
		}
		if !fn(k) {
			return nil
		}
	}
	return nil
}
