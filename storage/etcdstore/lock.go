package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/lock/lockdriver"
	"github.com/oncekit/oncekit/core/observe"
	"github.com/oncekit/oncekit/storage/internal/token"
)

// lockPrefix is the directory of key's queue. The key is path-escaped, so
// that "a" and "a/b" never share a directory.
func (s *Store) lockPrefix(key string) string {
	return s.opts.prefix + url.PathEscape(key) + "/"
}

// TryAcquire implements lock.Locker in one transaction: the key is taken
// when nobody holds or waits for it; otherwise the holder's entry is read
// for its remaining TTL.
func (s *Store) TryAcquire(ctx context.Context, key string, ttl time.Duration) (lock.Lease, error) {
	if err := s.check(ctx, key, ttl); err != nil {
		return nil, err
	}
	hot := lock.Owner(ctx) == "" && s.recent.Hot(key)
	if l := s.takeKept(ctx, key, ttl); l != nil {
		return l, nil
	}
	sess, err := s.session(ctx, ttl)
	if err != nil {
		return nil, s.wrap("acquire", key, ctx, err)
	}
	pfx := s.lockPrefix(key)
	tok := token.New()
	mine := pfx + fmt.Sprintf("%x-%s", int64(sess.id), tok)
	owner := lock.Owner(ctx)
	start := time.Now()
	then := []clientv3.Op{clientv3.OpPut(mine, expiry(start, ttl), clientv3.WithLease(sess.id))}
	if owner != "" {
		then = append(then, clientv3.OpPut(s.ownerKey(key), ownerRec{owner, mine, 1}.encode(), clientv3.WithLease(sess.id)))
	}
	resp, err := s.c.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(pfx).WithPrefix(), "=", 0)).
		Then(then...).
		Else(clientv3.OpGet(pfx, clientv3.WithFirstCreate()...)).
		Commit()
	if err != nil {
		if isLeaseNotFound(err) {
			sess.end()
		} else {
			// The transaction may have committed before its answer was
			// lost (a cancelled context, a connection cut after the
			// request was sent): its entry, ours alone, would hold the key
			// for nobody while the session lives.
			s.removeUnanswered(sess, key, mine, owner, ttl)
		}
		return nil, s.wrap("acquire", key, ctx, err)
	}
	if !resp.Succeeded && owner != "" {
		if l, ok, err := s.reenter(ctx, sess, key, owner, ttl); err != nil || ok {
			if err != nil {
				return nil, s.wrap("acquire", key, ctx, err)
			}
			return l.Lease(), nil
		}
	}
	if !resp.Succeeded {
		held := &lock.BusyError{Key: key, TTL: -1}
		if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
			held.TTL = remaining(string(kvs[0].Value))
		}
		return nil, held
	}
	l := newLease(s, sess, key, mine, tok, owner, resp.Header.Revision, 0, start.Add(ttl))
	l.hot = hot
	if !sess.add(l) { // the session ended meanwhile, and the entry with it
		l.End(lockdriver.Lost)
		s.removeEntry(sess, mine)
		return nil, fmt.Errorf("etcdstore: acquire %q: %w: %w", key, errSessionLost, lock.ErrNotAcquired)
	}
	return l.Lease(), nil
}

// Acquire implements lock.Locker. It writes its own entry in the key's
// queue and reads the first entry in one transaction; when that is not its
// own, it waits for the entry just before its own (its predecessor) to be
// deleted, with a watch that is in sync with the server, so one release
// wakes exactly one waiter. The fence is the entry's create revision. If
// the session lease is lost while it waits, it starts over in a new one.
func (s *Store) Acquire(ctx context.Context, key string, ttl time.Duration) (lock.Lease, error) {
	if err := s.check(ctx, key, ttl); err != nil {
		return nil, err
	}
	hot := lock.Owner(ctx) == "" && s.recent.Hot(key)
	if l := s.takeKept(ctx, key, ttl); l != nil {
		return l, nil
	}
	for {
		l, err := s.acquireIn(ctx, key, ttl, hot)
		if errors.Is(err, errSessionLost) && ctx.Err() == nil {
			continue
		}
		if err != nil {
			return nil, s.wrap("acquire", key, ctx, err)
		}
		return l, nil
	}
}

func (s *Store) acquireIn(ctx context.Context, key string, ttl time.Duration, hot bool) (_ lock.Lease, err error) {
	sess, err := s.session(ctx, ttl)
	if err != nil {
		return nil, err
	}
	owner := lock.Owner(ctx)
	if owner != "" {
		if l, ok, err := s.reenter(ctx, sess, key, owner, ttl); err != nil || ok {
			return l.public(), err
		}
	}
	var l *lease
	pfx := s.lockPrefix(key)
	tok := token.New()
	mine := pfx + fmt.Sprintf("%x-%s", int64(sess.id), tok)
	start := time.Now()
	resp, err := s.c.Txn(ctx).
		Then(clientv3.OpPut(mine, expiry(start, ttl), clientv3.WithLease(sess.id)),
			clientv3.OpGet(pfx, clientv3.WithFirstCreate()...)).
		Commit()
	if err != nil {
		s.removeEntry(sess, mine) // the put may have happened
		if isLeaseNotFound(err) {
			sess.end()
			return nil, errSessionLost
		}
		return nil, err
	}
	rev := resp.Header.Revision
	if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) == 0 || kvs[0].CreateRevision != rev {
		woken, err := s.waitTurn(ctx, sess, pfx, rev)
		if err != nil {
			s.removeEntry(sess, mine)
			return nil, err
		}
		defer func() {
			if l != nil && !woken.IsZero() {
				observe.Record(ctx, s.opts.observer, observe.Event{
					Op: observe.LockHandOff, Driver: driverName, Key: key, Outcome: observe.Notified,
					Fence: l.Fence(), Duration: time.Since(woken),
				})
			}
		}()
		// The lease's TTL counts from now. The entry's recorded expiry
		// (what other clients' TryAcquire reports) still counts from when
		// it joined the queue until the first Refresh: rewriting it here
		// would cost a second raft write on every contended acquisition.
		start = time.Now()
	}
	if owner != "" {
		if err := s.recordOwner(ctx, sess, key, owner, mine, rev); err != nil {
			s.removeEntry(sess, mine)
			return nil, err
		}
	}
	l = newLease(s, sess, key, mine, tok, owner, rev, 0, start.Add(ttl))
	l.hot = hot
	if !sess.add(l) { // the session ended meanwhile, and the entry with it
		l.End(lockdriver.Lost)
		s.removeEntry(sess, mine)
		return nil, errSessionLost
	}
	return l.Lease(), nil
}

func isLeaseNotFound(err error) bool {
	return err != nil && (errors.Is(err, rpctypes.ErrLeaseNotFound) || strings.Contains(err.Error(), "requested lease not found"))
}

// waitTurn returns once no entry older than ours is left in the queue. It
// waits for one entry at a time, the one just before ours, through the
// Store's shared watch on the queue (see queueWatch), and deletes that
// entry itself once its session's heartbeat is a TTL old (see
// heartbeat.go). woken is when the deletion that made ours first was seen
// (zero when it was first at once).
func (s *Store) waitTurn(ctx context.Context, sess *session, pfx string, rev int64) (woken time.Time, err error) {
	q := s.queueWatchFor(pfx)
	defer q.put()
	beats := s.beatWatchFor()
	defer beats.put()
	select {
	case <-q.ready:
	case <-ctx.Done():
		return time.Time{}, ctx.Err()
	}
	for {
		resp, err := s.c.Get(ctx, pfx, clientv3.WithPrefix(), clientv3.WithMaxCreateRev(rev-1),
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend), clientv3.WithLimit(1),
			clientv3.WithKeysOnly())
		if err != nil {
			return time.Time{}, err
		}
		if len(resp.Kvs) == 0 {
			return woken, nil // first in line
		}
		pred := string(resp.Kvs[0].Key)
		gone := q.register(pred)
		// The watch started before this Get, so a delete after it is
		// dispatched to us; the predecessor may have gone between the
		// Get and the registration, though, so look once more.
		g, err := s.c.Get(ctx, pred, clientv3.WithCountOnly())
		if err != nil {
			q.unregister(pred, gone)
			return time.Time{}, err
		}
		if g.Count == 0 {
			q.unregister(pred, gone)
			continue
		}
		if woken, err = s.waitGone(ctx, sess, beats, pfx, pred, gone); err != nil {
			q.unregister(pred, gone)
			return time.Time{}, err
		}
		q.unregister(pred, gone)
	}
}

// waitGone waits until pred is deleted (gone closes) or, once its
// session's heartbeat is a TTL old, deletes it; it returns when either was
// seen.
func (s *Store) waitGone(ctx context.Context, sess *session, beats *beatWatch, pfx, pred string, gone <-chan struct{}) (time.Time, error) {
	var b beatSeen
	id, beating := entryLease(pfx, pred)
	if beating {
		var err error
		if b, beating, err = s.lastBeat(ctx, beats, id); err != nil {
			return time.Time{}, err
		}
	}
	// Without a heartbeat (the session is gone, or its Store predates
	// them), pred goes with its session lease; stale then never fires.
	stale := time.NewTimer(time.Until(b.deadline()))
	if !beating {
		stale.Stop()
	}
	defer stale.Stop()
	for {
		select {
		case <-gone:
			return time.Now(), nil
		case <-sess.done:
			return time.Time{}, errSessionLost
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-stale.C:
		}
		if nb, ok := beats.latest(id); ok && nb.rev > b.rev {
			b = nb // it beat again
		} else {
			nb, reaped, err := s.reapIfDead(ctx, id, pred, b)
			if err != nil {
				return time.Time{}, err
			}
			if reaped {
				return time.Now(), nil
			}
			b = nb
		}
		stale.Reset(time.Until(b.deadline()))
	}
}

// waitDeleted returns when key no longer exists, with a watch of its own
// (used for a held lease's entry, where a delay does not matter). Once the
// watch is created, the key is checked again, in case it went before the
// watch began.
func (s *Store) waitDeleted(ctx context.Context, sess *session, key string) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := s.c.Watch(wctx, key, clientv3.WithCreatedNotify(), clientv3.WithFilterPut())
	created := false
	for {
		select {
		case wr, ok := <-wch:
			if !ok {
				if err := ctx.Err(); err != nil {
					return err
				}
				return errors.New("watch closed")
			}
			if err := wr.Err(); err != nil {
				return err
			}
			if wr.Created && !created {
				created = true
				g, err := s.c.Get(ctx, key, clientv3.WithCountOnly())
				if err != nil {
					return err
				}
				if g.Count == 0 {
					return nil
				}
			}
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypeDelete {
					return nil
				}
			}
		case <-sess.done:
			return errSessionLost
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// removeUnanswered removes what an acquisition's transaction wrote if it
// committed without its answer reaching us (undoUnanswered): its entry
// mine and, for an owner, the owner record that names it (when it still
// does). Both are ours alone: deleting them is a no-op when the
// transaction did not commit.
func (s *Store) removeUnanswered(sess *session, key, mine, owner string, ttl time.Duration) {
	own, rec := s.ownerKey(key), ownerRec{owner, mine, 1}.encode()
	s.undoUnanswered(sess.done, ttl, func(ctx context.Context) error {
		then := []clientv3.Op{clientv3.OpDelete(mine)}
		if owner == "" {
			_, err := s.c.Txn(ctx).Then(then...).Commit()
			return err
		}
		_, err := s.c.Txn(ctx).If(clientv3.Compare(clientv3.Value(own), "=", rec)).
			Then(append(then, clientv3.OpDelete(own))...).Else(then...).Commit()
		return err
	})
}

// removeEntry deletes an entry of ours that must not stay in its queue (a
// waiter that gave up): an orphan entry would block everyone behind it
// until the session ends. It tries once for up to a second, then keeps
// trying in the background until it succeeds or the session ends. Entries
// are unique per acquisition, so deleting by key is safe.
func (s *Store) removeEntry(sess *session, key string) {
	try := func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), attemptTimeout)
		defer cancel()
		_, err := s.c.Delete(ctx, key)
		return err == nil
	}
	if try() {
		return
	}
	s.bg.Go(func() {
		for wait := 50 * time.Millisecond; ; wait = min(2*wait, 2*time.Second) {
			select {
			case <-time.After(wait):
			case <-sess.done:
				return // the entry went with the session
			}
			if try() {
				return
			}
		}
	})
}

func (s *Store) check(ctx context.Context, key string, ttl time.Duration) error {
	if err := lockdriver.Validate(key, ttl); err != nil {
		return err
	}
	if err := lockdriver.ValidateOwner(lock.Owner(ctx)); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return errors.Join(lock.ErrNotAcquired, err)
	}
	return nil
}

// wrap turns an error of op on key into the Store's: a context error
// becomes ErrNotAcquired joined with it.
func (s *Store) wrap(op, key string, ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return errors.Join(lock.ErrNotAcquired, cerr, fmt.Errorf("etcdstore: %s %q: %w", op, key, err))
	}
	if errors.Is(err, lock.ErrClosed) {
		return fmt.Errorf("etcdstore: %s %q: %w", op, key, err)
	}
	return fmt.Errorf("etcdstore: %s %q: %w", op, key, err)
}

// expiry is the value of an entry: when its holder's TTL runs out, in Unix
// milliseconds, for other clients' BusyError.
func expiry(start time.Time, ttl time.Duration) string {
	return expiryValue(start.Add(ttl).UnixMilli())
}

// expiryValue is an entry's value of layout L1 (oncekit v0.1.0's):
// "L1|<expiry in Unix ms>". The value is only a hint: an entry holds its
// key by its place in the create-revision queue and its lease, whatever it
// says, so an entry of a later layout is held like any other.
func expiryValue(ms int64) string { return "L1|" + strconv.FormatInt(ms, 10) }

// expiryOf reads an entry's recorded expiry; 0 when it is not one this
// version reads.
func expiryOf(v []byte) int64 {
	rest, ok := strings.CutPrefix(string(v), "L1|")
	if !ok {
		return 0
	}
	ms, _ := strconv.ParseInt(rest, 10, 64)
	return ms
}

// remaining reads an entry's recorded expiry; -1 when it is unknown or
// already past (a holder that waited in the queue and has not refreshed).
func remaining(v string) time.Duration {
	ms := expiryOf([]byte(v))
	if ms == 0 {
		return -1
	}
	if d := time.Until(time.UnixMilli(ms)); d > 0 {
		return d
	}
	return -1
}
