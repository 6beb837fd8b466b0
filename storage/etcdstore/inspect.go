package etcdstore

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/lock/lockdriver"
)

// InspectLock implements lockdriver.Inspector. The holder is the oldest entry of
// the key's queue and Waiters counts the entries behind it; Fence is the
// holder's create revision. TTL is the holder's recorded expiry, or, when
// that has passed (a holder that waited in the queue records its expiry at
// its first refresh) or is unknown, the remaining TTL of the session lease
// that bounds it. Detail names the session lease.
func (s *Store) InspectLock(ctx context.Context, key string) (lockdriver.LockInfo, error) {
	info, _, err := s.inspectLock(ctx, key)
	return info, err
}

func (s *Store) inspectLock(ctx context.Context, key string) (lockdriver.LockInfo, string, error) {
	if err := lockdriver.ValidateKey(key); err != nil {
		return lockdriver.LockInfo{}, "", err
	}
	pfx := s.lockPrefix(key)
	resp, err := s.c.Txn(ctx).Then(
		clientv3.OpGet(pfx, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend)),
		clientv3.OpGet(s.ownerKey(key)),
	).Commit()
	if err != nil {
		return lockdriver.LockInfo{}, "", fmt.Errorf("etcdstore: inspect %q: %w", key, err)
	}
	info := lockdriver.LockInfo{Key: key}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return info, "", nil
	}
	holder := kvs[0]
	entry := string(holder.Key)
	info.Held, info.Holds, info.Waiters = true, 1, len(kvs)-1
	// The entry's first fence; the leases a kept entry serves have the next.
	info.Token, info.Fence = lockdriver.TokenPrefix(tokenOf(entry)), uint64(holder.CreateRevision)*s.fencesPerEntry()
	if o := resp.Responses[1].GetResponseRange().Kvs; len(o) > 0 {
		if rec, ok := decodeOwner(o[0].Value); ok && rec.entry == entry {
			info.Owner, info.Holds = rec.owner, rec.holds
		}
	}
	info.TTL = remaining(string(holder.Value))
	if id := clientv3.LeaseID(holder.Lease); id != clientv3.NoLease {
		info.Detail = fmt.Sprintf("session lease %x", int64(id))
		if info.TTL < 0 {
			if ttl, err := s.c.TimeToLive(ctx, id); err == nil && ttl.TTL >= 0 {
				info.TTL = time.Duration(ttl.TTL) * time.Second
			}
		}
	}
	return info, entry, nil
}

// ForceRelease implements lockdriver.Inspector: it deletes the holder's entry
// (and its owner record), which passes the key to the next in the queue;
// the holder sees its entry deleted and its lease ends as lost.
func (s *Store) ForceRelease(ctx context.Context, key string) (lockdriver.LockInfo, error) {
	info, entry, err := s.inspectLock(ctx, key)
	if err != nil || !info.Held {
		return info, err
	}
	resp, err := s.c.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(entry), "=", int64(info.Fence/s.fencesPerEntry()))).
		Then(clientv3.OpDelete(entry)).
		Commit()
	if err != nil {
		return info, fmt.Errorf("etcdstore: force release %q: %w", key, err)
	}
	if !resp.Succeeded { // released meanwhile
		info.Held = false
		return info, nil
	}
	if info.Owner != "" {
		own := s.ownerKey(key)
		_, _ = s.c.Txn(ctx).
			If(clientv3.Compare(clientv3.Value(own), "=", ownerRec{info.Owner, entry, info.Holds}.encode())).
			Then(clientv3.OpDelete(own)).Commit()
	}
	return info, nil
}

// InspectRecord implements idemdriver.Inspector: Fence is the claim entry's
// create revision.
func (s *Store) InspectRecord(ctx context.Context, key string) (idemdriver.RecordInfo, error) {
	if err := lockdriver.ValidateKey(key); err != nil {
		return idemdriver.RecordInfo{}, err
	}
	resp, err := s.c.Get(ctx, s.recordDir(key), clientv3.WithPrefix())
	if err != nil {
		return idemdriver.RecordInfo{}, fmt.Errorf("etcdstore: inspect record %q: %w", key, err)
	}
	info := idemdriver.RecordInfo{Key: key}
	switch len(resp.Kvs) {
	case 0:
		return info, nil
	case 1:
	default:
		info.Found, info.Corrupt = true, fmt.Sprintf("%d entries for one key", len(resp.Kvs))
		return info, nil
	}
	kv := resp.Kvs[0]
	info.Found = true
	rec, err := decodeRecord(key, kv.Value)
	if err != nil {
		info.Corrupt = err.Error()
		return info, nil
	}
	info.Fingerprint, info.Fence, info.Expires = rec.fp, uint64(kv.CreateRevision), rec.expires
	if rec.state == stateCompleted {
		info.State, info.Stored = idemdriver.Completed, rec.result
	} else {
		info.State, info.Token = idemdriver.InFlight, lockdriver.TokenPrefix(tokenOfRecord(string(kv.Key)))
	}
	if !time.Now().Before(rec.expires) {
		info.Detail = "expired: the next Begin replaces it"
	}
	return info, nil
}

// tokenOfRecord returns the token part of a record entry's name
// ("<dir>/<token>").
func tokenOfRecord(entry string) string {
	for i := len(entry) - 1; i >= 0; i-- {
		if entry[i] == '/' {
			return entry[i+1:]
		}
	}
	return entry
}

// DeleteRecord implements idemdriver.Inspector: it deletes every entry of the
// key, which wakes the duplicates watching it.
func (s *Store) DeleteRecord(ctx context.Context, key string) (bool, error) {
	if err := lockdriver.ValidateKey(key); err != nil {
		return false, err
	}
	resp, err := s.c.Delete(ctx, s.recordDir(key), clientv3.WithPrefix())
	if err != nil {
		return false, fmt.Errorf("etcdstore: delete record %q: %w", key, err)
	}
	return resp.Deleted > 0, nil
}

var (
	_ lockdriver.Inspector = (*Store)(nil)
	_ idemdriver.Inspector = (*Store)(nil)
)

// ListKeys implements idemdriver.Lister: a keys-only range read of the record
// prefix, 1000 keys a page.
func (s *Store) ListKeys(ctx context.Context, fn func(key string) bool) error {
	prefix := s.opts.recordPrefix
	end := clientv3.GetPrefixRangeEnd(prefix)
	from, last := prefix, ""
	for {
		resp, err := s.c.Get(ctx, from, clientv3.WithRange(end), clientv3.WithKeysOnly(),
			clientv3.WithLimit(1000), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
		if err != nil {
			return fmt.Errorf("etcdstore: list records: %w", err)
		}
		for _, kv := range resp.Kvs {
			dir, _, ok := strings.Cut(strings.TrimPrefix(string(kv.Key), prefix), "/")
			if !ok || dir == last {
				continue
			}
			last = dir
			if key, err := url.PathUnescape(dir); err == nil && !fn(key) {
				return nil
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return nil
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}
