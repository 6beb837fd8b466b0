package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/lock/lockdriver"
	"github.com/oncekit/oncekit/core/observe"
	"github.com/oncekit/oncekit/storage/internal/bg"
	"github.com/oncekit/oncekit/storage/internal/keep"
	"github.com/oncekit/oncekit/storage/internal/token"
)

// Client is the part of the etcd client the Store uses; *clientv3.Client
// satisfies it.
type Client interface {
	clientv3.KV
	clientv3.Lease
	clientv3.Watcher
}

// Store is a lock.Locker and an idem.Store over etcd. It is safe for
// concurrent use. Its keys are bound to session leases, one per TTL class
// (the TTL rounded up to whole seconds), created on first use and kept
// alive in the background while the process runs; Close revokes them.
type Store struct {
	c    Client
	opts options

	mu       sync.Mutex
	sessions map[int64]*session // by TTL class, in seconds
	closed   bool
	stop     chan struct{} // closed by Close: background retries end

	qmu    sync.Mutex
	queues map[string]*queueWatch // by lock directory, while waiters use it
	beats  *beatWatch             // the sessions' heartbeats, while waiters use them

	rmu       sync.Mutex
	retention map[time.Time]clientv3.LeaseID // idem records' retention leases, by minute

	cmu    sync.Mutex
	claims map[string]*claimTimer // this Store's in-flight idem claims, by entry

	recent   keep.Recent        // when this Store last let each key go (lease.hot)
	handOffs keep.HandOffs      // how long a kept entry serves (kept.go)
	kept     keep.Holds[*lease] // entries kept after their Release (kept.go)

	bg bg.Group

	owned   func() error // closes the client storage.Open made (nil for New's)
	ownOnce sync.Once
}

// session is one etcd lease that keys are bound to: the keys of every
// lease and claim whose TTL rounds up to its class. A process that dies
// or is cut off loses them within that TTL, by the server's clock.
type session struct {
	id     clientv3.LeaseID
	ttl    time.Duration // its class's TTL, or the granted TTL when shorter (see session)
	done   chan struct{} // closed when the lease is lost, revoked or the Store closes
	cancel context.CancelFunc

	mu     sync.Mutex
	leases map[*lease]struct{}
	valid  time.Time // when the last acknowledged keep-alive was sent + ttl
}

// New returns a Store over c. It makes no request until first used.
func New(c Client, opts ...Option) (*Store, error) {
	if c == nil {
		return nil, errors.New("etcdstore: New: nil client")
	}
	o := defaultOptions()
	for _, opt := range opts {
		opt(&o)
	}
	if err := o.validate(); err != nil {
		return nil, fmt.Errorf("etcdstore: New: %w", err)
	}
	return &Store{c: c, opts: o, sessions: map[int64]*session{}, stop: make(chan struct{}),
		handOffs: keep.HandOffs{Max: o.maxHandOffs, Hold: o.maxHold}}, nil
}

const driverName = "etcd"

// DriverName implements observe.Source: "etcd".
func (s *Store) DriverName() string { return driverName }

// Observer implements observe.Source: the WithObserver option.
func (s *Store) Observer() observe.Observer { return s.opts.observer }

// Close revokes the session leases, which deletes every key of the Store
// at once (kept entries too, see WithLinger), ends its leases (Done
// closes), and waits for background work. It does not close a client
// given to New; a Store storage.Open made closes the client it opened.
func (s *Store) Close() error {
	s.kept.Close() // the revokes below delete the kept entries
	s.mu.Lock()
	if !s.closed {
		close(s.stop)
	}
	s.closed = true
	sessions := s.sessions
	s.sessions = map[int64]*session{}
	s.mu.Unlock()
	var errs []error
	for _, sess := range sessions {
		ctx, cancel := context.WithTimeout(context.Background(), lockdriver.ReleaseTimeout)
		if _, err := s.c.Revoke(ctx, sess.id); err != nil {
			errs = append(errs, fmt.Errorf("etcdstore: close: revoke session: %w", err))
		}
		cancel()
		sess.end()
	}
	s.closeQueues()
	s.closeBeats()
	s.stopClaimTimers()
	s.bg.Wait()
	if s.owned != nil {
		s.ownOnce.Do(func() { errs = append(errs, s.owned()) })
	}
	return errors.Join(errs...)
}

// Client returns the client the Store was made with (for a Store that
// storage.Open made, the *clientv3.Client it opened).
func (s *Store) Client() Client { return s.c }

// ttlClass is the session a lease of ttl is bound to: ttl rounded up to
// whole seconds (etcd leases count in seconds, and etcd raises very short
// ones to its own minimum, about 2 s with default settings).
func ttlClass(ttl time.Duration) int64 {
	return max(1, int64((ttl+time.Second-1)/time.Second))
}

// session returns the live session of ttl's class, creating one when there
// is none.
func (s *Store) session(ctx context.Context, ttl time.Duration) (*session, error) {
	class := ttlClass(ttl)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, lock.ErrClosed
	}
	if sess := s.sessions[class]; sess != nil {
		select {
		case <-sess.done:
			delete(s.sessions, class)
		default:
			return sess, nil
		}
	}
	sent := time.Now()
	g, err := s.c.Grant(ctx, class)
	if err != nil {
		return nil, fmt.Errorf("etcdstore: grant session lease: %w", err)
	}
	// The server may grant more than the class asked for: it raises every
	// lease to its minimum TTL, 1.5 election timeouts rounded up to whole
	// seconds (2 s under etcd's default 1 s election timeout). The session
	// counts only the class's TTL — its validity, its keep-alives and the
	// TTL its heartbeat announces — so that waiters free a dead holder's
	// keys a TTL after its last heartbeat, as the caller asked, not when
	// the server's longer lease runs out. (The server's lease only has to
	// outlive the session's own count, which it does.)
	granted := min(time.Duration(g.TTL)*time.Second, time.Duration(class)*time.Second)
	// The heartbeat goes first: no entry is bound to the session before
	// waiters can tell when it was last alive (see heartbeat.go).
	if err := s.beat(ctx, g.ID, granted); err != nil {
		s.bg.Go(func() {
			rctx, cancel := context.WithTimeout(context.Background(), lockdriver.ReleaseTimeout)
			defer cancel()
			_, _ = s.c.Revoke(rctx, g.ID)
		})
		return nil, fmt.Errorf("etcdstore: write session heartbeat: %w", err)
	}
	kctx, cancel := context.WithCancel(context.Background())
	sess := &session{id: g.ID, ttl: granted, done: make(chan struct{}), cancel: cancel,
		leases: map[*lease]struct{}{}}
	sess.valid = sent.Add(sess.ttl)
	s.bg.Go(func() { s.keepAlive(kctx, sess) })
	s.sessions[class] = sess
	return sess, nil
}

// keepAlive renews sess every third of its TTL until ctx ends or the lease
// is lost. The session's validity counts from when each keep-alive was
// sent, never from when its answer arrived: the server's expiry is at
// least that late, so the session — and every lease bound to it — ends
// here before anyone else can be granted its keys. A keep-alive counts
// only once the heartbeat written after it is stored too: waiters free a
// session's keys a TTL after its last heartbeat (see heartbeat.go).
// Unanswered keep-alives are retried until the validity runs out.
func (s *Store) keepAlive(ctx context.Context, sess *session) {
	defer sess.end()
	t := time.NewTimer(sess.ttl / 3)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
		valid := sess.validUntil()
		sent := time.Now()
		if !sent.Before(valid) {
			return // lost: nothing acknowledged within the TTL
		}
		kctx, cancel := context.WithDeadline(ctx, valid)
		resp, err := s.c.KeepAliveOnce(kctx, sess.id)
		renewed := time.Duration(0)
		if err == nil && resp.TTL > 0 {
			renewed = min(time.Duration(resp.TTL)*time.Second, sess.ttl) // see session
			err = s.beat(kctx, sess.id, renewed)
		}
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err == nil && resp.TTL > 0:
			sess.setValid(sent.Add(renewed))
			t.Reset(max(renewed/3-time.Since(sent), time.Millisecond))
		case err == nil || isLeaseNotFound(err):
			return // expired on the server
		default: // unreachable, or an election: try again soon
			t.Reset(min(200*time.Millisecond, time.Until(valid)/2+time.Millisecond))
		}
	}
}

func (sess *session) validUntil() time.Time {
	sess.mu.Lock()
	defer sess.mu.Unlock()
	return sess.valid
}

func (sess *session) setValid(t time.Time) {
	sess.mu.Lock()
	defer sess.mu.Unlock()
	if t.After(sess.valid) {
		sess.valid = t
	}
}

// end marks the session over and ends its leases as lost.
func (sess *session) end() {
	sess.mu.Lock()
	select {
	case <-sess.done:
		sess.mu.Unlock()
		return
	default:
	}
	close(sess.done)
	leases := sess.leases
	sess.leases = nil
	sess.mu.Unlock()
	sess.cancel()
	for l := range leases {
		l.End(lockdriver.Lost)
	}
}

func (sess *session) add(l *lease) bool {
	sess.mu.Lock()
	defer sess.mu.Unlock()
	if sess.leases == nil {
		return false
	}
	sess.leases[l] = struct{}{}
	return true
}

func (sess *session) remove(l *lease) {
	sess.mu.Lock()
	defer sess.mu.Unlock()
	delete(sess.leases, l)
}

// lockPrefix is the directory of key's queue. The key is path-escaped, so
// that "a" and "a/b" never share a directory.
func (s *Store) lockPrefix(key string) string {
	return s.opts.prefix + url.PathEscape(key) + "/"
}

// TryAcquire implements lock.Locker in one transaction: the key is taken
// when nobody holds or waits for it; otherwise the holder's entry is read
// for its remaining TTL.
func (s *Store) TryAcquire(ctx context.Context, key string, ttl time.Duration) (lock.Lease, error) {
	return lockdriver.Seal(s.tryAcquire(ctx, key, ttl))
}

// tryAcquire is TryAcquire before its lease is sealed.
func (s *Store) tryAcquire(ctx context.Context, key string, ttl time.Duration) (lock.Lease, error) {
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
			return l, nil
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
	return l, nil
}

// Acquire implements lock.Locker. It writes its own entry in the key's
// queue and reads the first entry in one transaction; when that is not its
// own, it waits for the entry just before its own (its predecessor) to be
// deleted, with a watch that is in sync with the server, so one release
// wakes exactly one waiter. The fence is the entry's create revision. If
// the session lease is lost while it waits, it starts over in a new one.
func (s *Store) Acquire(ctx context.Context, key string, ttl time.Duration) (lock.Lease, error) {
	return lockdriver.Seal(s.acquireLease(ctx, key, ttl))
}

// acquireLease is Acquire before its lease is sealed.
func (s *Store) acquireLease(ctx context.Context, key string, ttl time.Duration) (lock.Lease, error) {
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
			return l, err
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
	return l, nil
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

var errSessionLost = errors.New("session lease lost")

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

var (
	_ lock.Locker = (*Store)(nil)
	_ lock.Lease  = (*lease)(nil)
)

// Ping is a health check for readiness probes: a linearizable read (it
// needs the cluster's leader and a quorum).
func (s *Store) Ping(ctx context.Context) error {
	if _, err := s.c.Get(ctx, "oncekit-ping", clientv3.WithCountOnly()); err != nil {
		return fmt.Errorf("etcdstore: ping: %w", err)
	}
	return nil
}
