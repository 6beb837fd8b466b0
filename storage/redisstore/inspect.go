package redisstore

import (
	"context"
	"fmt"
	"time"

	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/lock/lockdriver"
	"github.com/oncekit/oncekit/storage/internal/rediskit"
)

// InspectLock implements lockdriver.Inspector: one round trip. Waiters counts the
// processes queued in Redis, not the goroutines waiting inside each.
func (s *Store) InspectLock(ctx context.Context, key string) (lockdriver.LockInfo, error) {
	if err := lockdriver.ValidateKey(key); err != nil {
		return lockdriver.LockInfo{}, err
	}
	st, err := s.base.InspectLock(ctx, s.client, key)
	if err != nil {
		return lockdriver.LockInfo{}, fmt.Errorf("redisstore: inspect %q: %w", key, err)
	}
	return st.Info(key), nil
}

// ForceRelease implements lockdriver.Inspector: it deletes the key and announces
// the release, in one script.
func (s *Store) ForceRelease(ctx context.Context, key string) (lockdriver.LockInfo, error) {
	info, err := s.InspectLock(ctx, key)
	if err != nil || !info.Held {
		return info, err
	}
	tok, err := rediskit.ForceRelease(ctx, s.client, s.base.Keys, key, s.base.PubSub.ScriptArg())
	if err != nil {
		return info, fmt.Errorf("redisstore: force release %q: %w", key, err)
	}
	info.Held = tok != ""
	if tok != "" {
		info.Token = lockdriver.TokenPrefix(tok)
	}
	return info, nil
}

// InspectRecord implements idemdriver.Inspector: one round trip.
func (s *Store) InspectRecord(ctx context.Context, key string) (idemdriver.RecordInfo, error) {
	k, err := idemdriver.CheckKey(key)
	if err != nil {
		return idemdriver.RecordInfo{}, err
	}
	st, err := rediskit.InspectRecord(ctx, s.client, s.base.Records, k)
	if err != nil {
		return idemdriver.RecordInfo{}, fmt.Errorf("redisstore: inspect record %q: %w", key, err)
	}
	return st.Info(key, time.Now()), nil
}

// DeleteRecord implements idemdriver.Inspector: one round trip, which also wakes
// the duplicates waiting for the key.
func (s *Store) DeleteRecord(ctx context.Context, key string) (bool, error) {
	k, err := idemdriver.CheckKey(key)
	if err != nil {
		return false, err
	}
	ok, err := rediskit.DeleteRecord(ctx, s.client, s.base.Records, k, s.base.PubSub.ScriptArg())
	if err != nil {
		return false, fmt.Errorf("redisstore: delete record %q: %w", key, err)
	}
	return ok, nil
}

// ListKeys implements idemdriver.Lister: a SCAN of the record prefix (on every
// primary of a Cluster).
func (s *Store) ListKeys(ctx context.Context, fn func(key string) bool) error {
	if err := rediskit.ListRecordKeys(ctx, s.raw, s.base.Records, fn); err != nil {
		return fmt.Errorf("redisstore: list records: %w", err)
	}
	return nil
}
