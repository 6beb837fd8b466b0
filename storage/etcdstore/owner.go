package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/lock/lockdriver"
)

// Owner reentrancy (lock.WithOwner). While an owner holds a key, a record
// next to the key's queue names the owner, the holder's entry and the
// number of holds: "<prefix><escaped key>\x00owner" (outside every queue
// directory, which end in "/"; escaped keys never contain a NUL). Taking
// one more hold, or giving one back, is a transaction conditional on the
// record's mod revision and the entry's create revision.

// ownerKey is the name of key's owner record.
func (s *Store) ownerKey(key string) string {
	return s.opts.prefix + url.PathEscape(key) + "\x00owner"
}

type ownerRec struct {
	owner string
	entry string
	holds int
}

// encode is the owner record of layout O1 (oncekit v0.1.0's):
// "O1\x00<owner>\x00<entry>\x00<holds>". A record of another layout is
// not read: its owner cannot re-enter the hold, which frees as any other.
func (r ownerRec) encode() string {
	return "O1\x00" + r.owner + "\x00" + r.entry + "\x00" + strconv.Itoa(r.holds)
}

func decodeOwner(v []byte) (ownerRec, bool) {
	parts := strings.Split(string(v), "\x00")
	if len(parts) != 4 || parts[0] != "O1" {
		return ownerRec{}, false
	}
	n, err := strconv.Atoi(parts[3])
	if err != nil || n < 1 {
		return ownerRec{}, false
	}
	return ownerRec{owner: parts[1], entry: parts[2], holds: n}, true
}

// tokenOf returns the token part of an entry's name ("<lease>-<token>").
func tokenOf(entry string) string {
	_, tok, _ := strings.Cut(entry[strings.LastIndexByte(entry, '/')+1:], "-")
	return tok
}

// reenter takes one more hold for owner if owner holds key. It reports
// false when the key is not held by owner.
func (s *Store) reenter(ctx context.Context, sess *session, key, owner string, ttl time.Duration) (*lease, bool, error) {
	pfx, ok := s.lockPrefix(key), s.ownerKey(key)
	for range 8 {
		resp, err := s.c.Txn(ctx).Then(
			clientv3.OpGet(pfx, clientv3.WithFirstCreate()...),
			clientv3.OpGet(ok)).Commit()
		if err != nil {
			return nil, false, err
		}
		first := resp.Responses[0].GetResponseRange().Kvs
		recs := resp.Responses[1].GetResponseRange().Kvs
		if len(first) == 0 || len(recs) == 0 {
			return nil, false, nil
		}
		rec, valid := decodeOwner(recs[0].Value)
		if !valid || rec.owner != owner || rec.entry != string(first[0].Key) {
			return nil, false, nil
		}
		rec.holds++
		start := time.Now()
		exp := max(start.Add(ttl).UnixMilli(), expiryOf(first[0].Value))
		t, err := s.c.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(ok), "=", recs[0].ModRevision),
				clientv3.Compare(clientv3.CreateRevision(rec.entry), "=", first[0].CreateRevision)).
			Then(clientv3.OpPut(ok, rec.encode(), clientv3.WithIgnoreLease()),
				clientv3.OpPut(rec.entry, expiryValue(exp), clientv3.WithIgnoreLease())).
			Commit()
		if err != nil {
			return nil, false, err
		}
		if !t.Succeeded {
			continue // another hold came or went meanwhile: look again
		}
		l := newLease(s, sess, key, rec.entry, tokenOf(rec.entry), owner, first[0].CreateRevision, 0, start.Add(ttl))
		if !sess.add(l) {
			l.End(lockdriver.Lost)
			return nil, false, errSessionLost
		}
		return l, true, nil
	}
	return nil, false, errors.New("owner record keeps changing")
}

// recordOwner writes the owner record for a freshly granted entry.
func (s *Store) recordOwner(ctx context.Context, sess *session, key, owner, entry string, rev int64) error {
	rec := ownerRec{owner: owner, entry: entry, holds: 1}
	t, err := s.c.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(entry), "=", rev)).
		Then(clientv3.OpPut(s.ownerKey(key), rec.encode(), clientv3.WithLease(sess.id))).
		Commit()
	if err != nil {
		return err
	}
	if !t.Succeeded {
		return fmt.Errorf("%w: the entry went before its owner was recorded", lock.ErrLockLost)
	}
	return nil
}

// giveBack returns one of an owner's holds: the entry (and the record) is
// deleted with the last. It reports whether the entry was still held.
func (s *Store) giveBack(ctx context.Context, l *lease) (bool, error) {
	ok := s.ownerKey(l.Key())
	for range 8 {
		resp, err := s.c.Txn(ctx).Then(clientv3.OpGet(ok), clientv3.OpGet(l.entry, clientv3.WithCountOnly())).Commit()
		if err != nil {
			return false, err
		}
		if resp.Responses[1].GetResponseRange().Count == 0 {
			return false, nil // the entry is gone: lost
		}
		recs := resp.Responses[0].GetResponseRange().Kvs
		rec, valid := ownerRec{}, false
		if len(recs) > 0 {
			rec, valid = decodeOwner(recs[0].Value)
		}
		if !valid || rec.entry != l.entry {
			d, err := s.c.Delete(ctx, l.entry) // no record: a single hold
			return err == nil && d.Deleted > 0, err
		}
		var then []clientv3.Op
		if rec.holds > 1 {
			rec.holds--
			then = []clientv3.Op{clientv3.OpPut(ok, rec.encode(), clientv3.WithIgnoreLease())}
		} else {
			then = []clientv3.Op{clientv3.OpDelete(ok), clientv3.OpDelete(l.entry)}
		}
		t, err := s.c.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(ok), "=", recs[0].ModRevision),
				clientv3.Compare(clientv3.CreateRevision(l.entry), "=", l.rev())).
			Then(then...).Commit()
		if err != nil {
			return false, err
		}
		if t.Succeeded {
			return true, nil
		}
	}
	return false, errors.New("owner record keeps changing")
}
