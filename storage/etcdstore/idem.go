package etcdstore

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/url"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/lock/lockdriver"
	"github.com/oncekit/oncekit/storage/internal/token"
)

// Idempotency records (idemdriver.Store). Each claim of a key K is an entry of
// its own, "<record prefix><escaped K>/<token>", so a claim taken over after
// its lease ran out is a new key with a new create revision: a stale
// holder's Complete, Abandon and Extend compare that revision and can never
// touch the newer claim. The revision is also the claim's fence.
//
// An entry's value is a version byte, a state byte ('i' in flight, 'c'
// completed), the expiry in Unix milliseconds (the lease, a hint for other
// clients; or the retention, checked on every read), the fingerprint, and
// the result: layout 1, oncekit v0.1.0's, which every later version reads.
// An entry whose first byte is another small version number is
// idem.ErrUnknownLayout (a later version's, during a rolling deploy: never
// taken over); anything else is idem.ErrCorruptRecord. In-flight entries are
// bound to the session lease of their lease's TTL class, and the claiming
// Store deletes them when their lease runs out without an Extend: another
// client never takes a claim over by comparing its clock with the
// claimer's. Completed entries are bound to a lease shared by every record
// that expires in the same minute, which deletes them some time after
// their retention.

const (
	recordVersion  = 1
	stateInFlight  = 'i'
	stateCompleted = 'c'
	retentionSlot  = time.Minute
)

func (s *Store) recordDir(key string) string {
	return s.opts.recordPrefix + url.PathEscape(key) + "/"
}

// attemptsKey is where key's claims are counted (idemdriver.Claim.Attempt): each
// claim puts it, so its version is the number of claims since it was
// made; a completion deletes it. It is bound to a lease that ends between
// idem.AttemptMemory and an hour more after the last claim. ('#' is
// escaped in a key, so the name is no key's record directory, and
// ListKeys passes over it.)
func (s *Store) attemptsKey(key string) string {
	return s.opts.recordPrefix + url.PathEscape(key) + "#attempts"
}

// countAttempt is the put of key's attempts counter a claim makes, in the
// claim's transaction.
func (s *Store) countAttempt(ctx context.Context, key string) (clientv3.Op, error) {
	// One lease per hour of claims (not per minute, as retentions): it
	// ends between AttemptMemory and AttemptMemory + 1 h after a claim.
	until := time.Now().Add(idem.AttemptMemory).Truncate(time.Hour).Add(time.Hour)
	lease, err := s.retentionLease(ctx, until)
	if err != nil {
		return clientv3.Op{}, err
	}
	return clientv3.OpPut(s.attemptsKey(key), "", clientv3.WithLease(lease), clientv3.WithPrevKV()), nil
}

// attemptOf reads a claim's attempt from its transaction's answer to
// countAttempt's put.
func attemptOf(r *etcdserverpb.ResponseOp) int {
	if p := r.GetResponsePut().GetPrevKv(); p != nil {
		return int(p.Version) + 1
	}
	return 1
}

type recordVal struct {
	state   byte
	expires time.Time
	fp      string
	result  []byte
}

func (r recordVal) encode() string {
	b := make([]byte, 0, 12+len(r.fp)+len(r.result))
	b = append(b, recordVersion, r.state)
	b = binary.BigEndian.AppendUint64(b, uint64(r.expires.UnixMilli()))
	b = binary.BigEndian.AppendUint16(b, uint16(len(r.fp)))
	b = append(b, r.fp...)
	return string(append(b, r.result...))
}

func decodeRecord(key string, v []byte) (recordVal, error) {
	bad := func(why string) (recordVal, error) {
		return recordVal{}, idemdriver.CorruptRecord(key, why)
	}
	if len(v) > 0 && v[0] > recordVersion && v[0] < ' ' {
		// A small version byte other than ours: a later (or an
		// earlier) version's layout, never judged nor taken over.
		return recordVal{}, fmt.Errorf("%w: the record of %q is of layout %d, this version reads %d (a version that wrote it is still running, or this one is older: it is left alone)",
			idem.ErrUnknownLayout, key, v[0], recordVersion)
	}
	if len(v) < 12 || v[0] != recordVersion {
		return bad("unknown record encoding")
	}
	r := recordVal{state: v[1], expires: time.UnixMilli(int64(binary.BigEndian.Uint64(v[2:10])))}
	if r.state != stateInFlight && r.state != stateCompleted {
		return bad(fmt.Sprintf("unknown record state %q", r.state))
	}
	n := int(binary.BigEndian.Uint16(v[10:12]))
	if len(v) < 12+n {
		return bad("truncated record")
	}
	r.fp, r.result = string(v[12:12+n]), v[12+n:]
	return r, nil
}

// Begin implements idemdriver.Store: one transaction, or two when it takes over a
// claim whose lease ran out.
func (s *Store) Begin(ctx context.Context, k idemdriver.Key, fingerprint string, ttl time.Duration) (idemdriver.Claim, error) {
	if err := k.Check(); err != nil {
		return idemdriver.Claim{}, err
	}
	key := k.String()
	if err := lockdriver.ValidateTTL(ttl); err != nil {
		return idemdriver.Claim{}, err
	}
	if len(fingerprint) > 1<<15 {
		return idemdriver.Claim{}, fmt.Errorf("etcdstore: begin %q: fingerprint of %d bytes", key, len(fingerprint))
	}
	sess, err := s.session(ctx, ttl)
	if err != nil {
		return idemdriver.Claim{}, fmt.Errorf("etcdstore: begin %q: %w", key, err)
	}
	dir := s.recordDir(key)
	tok := token.New()
	entry := dir + tok
	now := time.Now()
	val := recordVal{state: stateInFlight, expires: now.Add(ttl), fp: fingerprint}.encode()
	count, err := s.countAttempt(ctx, key)
	if err != nil {
		return idemdriver.Claim{}, fmt.Errorf("etcdstore: begin %q: %w", key, err)
	}
	resp, err := s.c.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(dir).WithPrefix(), "=", 0)).
		Then(clientv3.OpPut(entry, val, clientv3.WithLease(sess.id)), count).
		Else(clientv3.OpGet(dir, clientv3.WithPrefix())).
		Commit()
	if err != nil {
		s.dropUnanswered(entry, ttl)
		return idemdriver.Claim{}, fmt.Errorf("etcdstore: begin %q: %w", key, err)
	}
	if resp.Succeeded {
		rev := resp.Header.Revision
		s.startClaimTimer(entry, rev, now.Add(ttl))
		return idemdriver.Claim{Key: k, State: idemdriver.Acquired, Fingerprint: fingerprint, Token: tok,
			Fence: uint64(rev), Attempt: attemptOf(resp.Responses[1]), Expires: claimValidity(now.Add(ttl), sess)}, nil
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) != 1 {
		return idemdriver.Claim{}, idemdriver.CorruptRecord(key, fmt.Sprintf("%d entries for one key", len(kvs)))
	}
	cur, err := decodeRecord(key, kvs[0].Value)
	if err != nil {
		return idemdriver.Claim{}, err
	}
	// An in-flight entry lives until its claimer completes or abandons it,
	// its claimer's Store ends it when its ttl runs out without an
	// Extend, or its claimer's process is gone and the session ttl
	// expires. Its recorded expiry, written with the claimer's clock, is
	// only a hint here (RetryAfter): no decision compares another client's
	// clock with ours. A completed record past its retention (a coarse
	// bound, kept to the minute by its ttl) is replaced.
	if cur.state == stateCompleted && !now.Before(cur.expires) {
		put := clientv3.OpPut(entry, val, clientv3.WithLease(sess.id))
		t, err := s.c.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(string(kvs[0].Key)), "=", kvs[0].ModRevision)).
			Then(clientv3.OpDelete(string(kvs[0].Key)), put, count).
			Commit()
		if err != nil {
			s.dropUnanswered(entry, ttl)
			return idemdriver.Claim{}, fmt.Errorf("etcdstore: begin %q: %w", key, err)
		}
		if t.Succeeded {
			rev := t.Header.Revision
			s.startClaimTimer(entry, rev, now.Add(ttl))
			return idemdriver.Claim{Key: k, State: idemdriver.Acquired, Fingerprint: fingerprint, Token: tok,
				Fence: uint64(rev), Attempt: attemptOf(t.Responses[2]), Expires: claimValidity(now.Add(ttl), sess)}, nil
		}
		return s.Begin(ctx, k, fingerprint, ttl) // lost the race: look again
	}
	c := idemdriver.Claim{Key: k, Fingerprint: fingerprint, Expires: cur.expires}
	switch {
	case cur.fp != fingerprint:
		c.State = idemdriver.Mismatch
	case cur.state == stateCompleted:
		c.State, c.Result = idemdriver.Completed, cur.result
	default:
		c.State = idemdriver.InFlight
	}
	return c, nil
}

// finish runs op on c's entry only while c still holds it: the entry exists
// with c's create revision and its lease has not run out.
func (s *Store) finish(ctx context.Context, c idemdriver.Claim, op string, update func(cur recordVal, sessionLease clientv3.LeaseID) (clientv3.Op, error), done func(rev int64)) error {
	if c.Token == "" {
		return fmt.Errorf("etcdstore: %s %q: %w", op, c.Key, lock.ErrLockLost)
	}
	entry := s.recordDir(c.Key.String()) + c.Token
	g, err := s.c.Get(ctx, entry)
	if err != nil {
		return fmt.Errorf("etcdstore: %s %q: %w", op, c.Key, err)
	}
	if len(g.Kvs) == 0 || g.Kvs[0].CreateRevision != int64(c.Fence) {
		return fmt.Errorf("etcdstore: %s %q: %w", op, c.Key, lock.ErrLockLost)
	}
	cur, err := decodeRecord(c.Key.String(), g.Kvs[0].Value)
	if err != nil {
		return err
	}
	if cur.state != stateInFlight || !time.Now().Before(cur.expires) {
		return fmt.Errorf("etcdstore: %s %q: %w", op, c.Key, lock.ErrLockLost)
	}
	o, err := update(cur, clientv3.LeaseID(g.Kvs[0].Lease))
	if err != nil {
		return fmt.Errorf("etcdstore: %s %q: %w", op, c.Key, err)
	}
	t, err := s.c.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(entry), "=", g.Kvs[0].ModRevision)).
		Then(o).Commit()
	if err != nil {
		return fmt.Errorf("etcdstore: %s %q: %w", op, c.Key, err)
	}
	if !t.Succeeded {
		return fmt.Errorf("etcdstore: %s %q: %w", op, c.Key, lock.ErrLockLost)
	}
	done(t.Header.Revision)
	return nil
}

// Complete implements idemdriver.Store in one transaction (plus, once a minute,
// the grant of a retention lease): the result is stored if the claim's
// entry still exists with the claim's create revision. Entries are never
// reused, so that proves no newer claim took the key.
func (s *Store) Complete(ctx context.Context, c idemdriver.Claim, result []byte, retention time.Duration) error {
	ctx, cancel := cleanupIfDone(ctx)
	defer cancel()
	entry, val, lease, err := s.completion(ctx, c, result, retention)
	if err != nil {
		return err
	}
	t, err := s.c.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(entry), "=", int64(c.Fence))).
		Then(clientv3.OpPut(entry, val, clientv3.WithLease(lease)), clientv3.OpDelete(s.attemptsKey(c.Key.String()))).
		Commit()
	if err != nil {
		return fmt.Errorf("etcdstore: complete %q: %w", c.Key, err)
	}
	if !t.Succeeded {
		return fmt.Errorf("etcdstore: complete %q: %w", c.Key, lock.ErrLockLost)
	}
	s.stopClaimTimer(entry)
	return nil
}

// completion checks a Complete's arguments and returns c's entry, its
// completed value and the retention lease it is bound to.
func (s *Store) completion(ctx context.Context, c idemdriver.Claim, result []byte, retention time.Duration) (entry, val string, lease clientv3.LeaseID, err error) {
	if err := lockdriver.ValidateTTL(retention); err != nil {
		return "", "", 0, err
	}
	if c.Token == "" {
		return "", "", 0, fmt.Errorf("etcdstore: complete %q: %w", c.Key, lock.ErrLockLost)
	}
	expires := time.Now().Add(retention)
	if lease, err = s.retentionLease(ctx, expires); err != nil {
		return "", "", 0, fmt.Errorf("etcdstore: complete %q: %w", c.Key, err)
	}
	entry = s.recordDir(c.Key.String()) + c.Token
	val = recordVal{state: stateCompleted, expires: expires, fp: c.Fingerprint, result: result}.encode()
	return entry, val, lease, nil
}

// Abandon implements idemdriver.Store.
func (s *Store) Abandon(ctx context.Context, c idemdriver.Claim) error {
	ctx, cancel := cleanupIfDone(ctx)
	defer cancel()
	return s.finish(ctx, c, "abandon", func(recordVal, clientv3.LeaseID) (clientv3.Op, error) {
		return clientv3.OpDelete(s.recordDir(c.Key.String()) + c.Token), nil
	}, func(int64) { s.stopClaimTimer(s.recordDir(c.Key.String()) + c.Token) })
}

// claimValidity is the earlier of a claim's lease and the validity of the
// session its entry is bound to: when the session's lease runs out on the
// server, the entry goes with it, whatever the claim's own lease says.
func claimValidity(lease time.Time, sess *session) time.Time {
	if v := sess.validUntil(); v.Before(lease) {
		return v
	}
	return lease
}

// Extend implements idemdriver.Store: the claim's entry and the session lease it
// is bound to are both renewed (two round trips after the read).
func (s *Store) Extend(ctx context.Context, c idemdriver.Claim, ttl time.Duration) error {
	if err := lockdriver.ValidateTTL(ttl); err != nil {
		return err
	}
	expires := time.Now().Add(ttl)
	return s.finish(ctx, c, "extend", func(cur recordVal, sessionLease clientv3.LeaseID) (clientv3.Op, error) {
		// The entry lives as long as the session lease it is bound to:
		// renew that too, so that the claim is good for its TTL from the
		// start of this call on both counts (the session's TTL class is at
		// least TTL). The session's own keep-alive may be failing.
		if r, err := s.c.KeepAliveOnce(ctx, sessionLease); isLeaseNotFound(err) {
			return clientv3.Op{}, fmt.Errorf("the claim's session lease expired: %w", lock.ErrLockLost)
		} else if err != nil {
			return clientv3.Op{}, fmt.Errorf("renew the claim's session lease: %w", err)
		} else if time.Duration(r.TTL)*time.Second < ttl {
			return clientv3.Op{}, fmt.Errorf("the claim's session lease was renewed for %ds, less than the TTL %s", r.TTL, ttl)
		}
		cur.expires = expires
		return clientv3.OpPut(s.recordDir(c.Key.String())+c.Token, cur.encode(), clientv3.WithIgnoreLease()), nil
	}, func(rev int64) { s.startClaimTimer(s.recordDir(c.Key.String())+c.Token, rev, expires) })
}

// claimTimer ends one of this Store's in-flight claims when its lease runs
// out without an Extend: it deletes the entry if it is still the version
// this Store last wrote (not completed, abandoned or extended since).
type claimTimer struct {
	t   *time.Timer
	rev int64
}

func (s *Store) startClaimTimer(entry string, rev int64, expires time.Time) {
	s.cmu.Lock()
	defer s.cmu.Unlock()
	if s.claims == nil {
		s.claims = map[string]*claimTimer{}
	}
	if ct := s.claims[entry]; ct != nil {
		ct.t.Stop()
	}
	ct := &claimTimer{rev: rev}
	ct.t = time.AfterFunc(time.Until(expires), func() {
		s.cmu.Lock()
		if s.claims[entry] != ct {
			s.cmu.Unlock()
			return
		}
		delete(s.claims, entry)
		s.cmu.Unlock()
		s.bg.Go(func() { s.expireClaim(entry, rev) })
	})
	s.claims[entry] = ct
}

// expireClaim deletes an in-flight claim's entry whose lease ran out,
// unless it changed since rev. A failed attempt (a leader election, a lost
// connection) is tried again until the delete is decided or the Store
// closes: the entry lives as long as its session, which this Store keeps
// alive, so a claim left behind would answer every retry of its key "in
// flight" for as long as the process lives.
func (s *Store) expireClaim(entry string, rev int64) {
	// Done when deleted, or changed since (completed, abandoned, extended);
	// Close revokes the sessions, and the entry with them.
	retryUntil(s.stop, func(ctx context.Context) error {
		_, err := s.c.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(entry), "=", rev)).
			Then(clientv3.OpDelete(entry)).Commit()
		return err
	})
}

// dropUnanswered deletes entry, the in-flight claim of a Begin whose
// transaction failed without an answer that says it did not commit (a
// cancelled context, a connection lost after the request was sent): if it
// did commit, nobody holds the claim to complete or abandon it, and its
// session, which this Store keeps alive, would keep it in flight for as
// long as the process lives. The entry is the Begin's own (its token), so
// the delete touches nothing else (undoUnanswered: now, and again once the
// claim's lease has passed, until the Store closes, which revokes the
// sessions and the entry with them). The attempt the transaction counted
// stays counted: the next claim's Attempt may be one too high, never too
// low.
func (s *Store) dropUnanswered(entry string, ttl time.Duration) {
	s.undoUnanswered(s.stop, ttl, func(ctx context.Context) error {
		_, err := s.c.Delete(ctx, entry)
		return err
	})
}

func (s *Store) stopClaimTimer(entry string) {
	s.cmu.Lock()
	defer s.cmu.Unlock()
	if ct := s.claims[entry]; ct != nil {
		ct.t.Stop()
		delete(s.claims, entry)
	}
}

func (s *Store) stopClaimTimers() {
	s.cmu.Lock()
	defer s.cmu.Unlock()
	for entry, ct := range s.claims {
		ct.t.Stop()
		delete(s.claims, entry)
	}
}

func cleanupIfDone(ctx context.Context) (context.Context, context.CancelFunc) {
	if ctx.Err() != nil {
		return lockdriver.CleanupContext(ctx)
	}
	return ctx, func() {}
}

// retentionLease returns a lease that outlives expires, shared by every
// record expiring in the same minute: one grant per minute of expiries
// rather than one per record.
func (s *Store) retentionLease(ctx context.Context, expires time.Time) (clientv3.LeaseID, error) {
	slot := expires.Truncate(retentionSlot).Add(retentionSlot)
	s.rmu.Lock()
	defer s.rmu.Unlock()
	if s.retention == nil {
		s.retention = map[time.Time]clientv3.LeaseID{}
	}
	if id, ok := s.retention[slot]; ok {
		return id, nil
	}
	for t := range s.retention { // forget slots that have passed
		if t.Before(time.Now()) {
			delete(s.retention, t)
		}
	}
	ttl := int64(time.Until(slot.Add(retentionSlot))/time.Second) + 1
	g, err := s.c.Grant(ctx, ttl)
	if err != nil {
		return 0, err
	}
	s.retention[slot] = g.ID
	return g.ID, nil
}

// WaitChange implements idemdriver.Waiter with a watch on the key's records.
func (s *Store) WaitChange(ctx context.Context, k idemdriver.Key, until time.Time) error {
	key := k.String()
	dir := s.recordDir(key)
	wctx, cancel := context.WithDeadline(ctx, until.Add(time.Millisecond))
	defer cancel()
	wch := s.c.Watch(clientv3.WithRequireLeader(wctx), dir, clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	for {
		select {
		case wr, ok := <-wch:
			if !ok || wr.Err() != nil {
				return ctx.Err()
			}
			if wr.Created {
				// Look once more: the record may have changed before the watch.
				g, err := s.c.Get(wctx, dir, clientv3.WithPrefix())
				if err != nil || len(g.Kvs) != 1 {
					return nil
				}
				if r, err := decodeRecord(key, g.Kvs[0].Value); err != nil || r.state != stateInFlight {
					return nil
				}
				continue
			}
			if len(wr.Events) > 0 {
				return nil
			}
		case <-wctx.Done():
			return ctx.Err()
		}
	}
}

var (
	_ idemdriver.Store  = (*Store)(nil)
	_ idemdriver.Waiter = (*Store)(nil)
)
