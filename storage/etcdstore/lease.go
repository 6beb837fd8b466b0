package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/lock/lockdriver"
	"github.com/oncekit/oncekit/storage/internal/keep"
)

// lease is one held entry. Its key lives as long as the session lease and
// is deleted by Release, by its own TTL running out without a Refresh (the
// Store deletes it then), or by the session ending. Its lifecycle is
// lockdriver.Control's; this type adds the requests to etcd and the watch
// that ends it when someone else deletes the entry.
type lease struct {
	lockdriver.Control
	s        *Store
	sess     *session
	entry    string // the etcd key of this acquisition (shared by the leases of a kept entry)
	owner    string // set for an owner's hold (lock.WithOwner)
	revision int64  // the entry's create revision
	used     int64  // the leases of the entry before this one (kept.go): the fence is revision × fencesPerEntry() + used
	took     time.Time
	hot      bool // taken by a non-owner right after this Store let the key go: kept on Release

	// passed is set when the Store kept the lease's entry (kept.go): the
	// entry is no longer this lease's to refresh or delete. (A Refresh in
	// flight when the lease was released would otherwise delete the entry
	// its successor takes.)
	passed atomic.Bool

	mu       sync.Mutex
	watching bool
	stopW    context.CancelFunc
}

// fencesPerEntry scales fences: an entry's leases (the first, and those a
// kept entry serves, kept.go) take revision × fencesPerEntry + 0, 1, …, so
// every lease of a later entry, whose create revision is higher, has a
// higher fence. Every Store scales alike, whatever its options: a Store
// that keeps no entries (WithMaxLocalHandOffs(0)) issuing bare revisions
// next to one that scales them would hand a later holder a lower fence.
func (s *Store) fencesPerEntry() uint64 { return keep.ReservedFences }

// newLease returns a held lease, the used+1-th of its entry: its fence is
// the entry's create revision × fencesPerEntry + used.
func newLease(s *Store, sess *session, key, entry, tok, owner string, rev, used int64, deadline time.Time) *lease {
	l := &lease{s: s, sess: sess, entry: entry, owner: owner, revision: rev, used: used, took: time.Now()}
	l.Init(lockdriver.Config{
		Driver: "etcdstore", Key: key, Token: tok, Fence: uint64(rev)*s.fencesPerEntry() + uint64(used),
		Deadline: deadline,
		Store:    l,
		OnEnd:    func(lockdriver.State) { l.ended() },
		// The TTL ran out: free the key for others now rather than at the
		// end of the session, retrying while the servers are unreachable.
		// An owner's hold gives back only itself.
		OnExpire: func() { s.bg.Go(l.deleteUntilDone) },
	})
	return l
}

func (l *lease) rev() int64 { return l.revision }

// StoreDeadline implements lockdriver.Deadliner: the lease's own
// deadline d, or the session's validity when that ends first — the entry
// goes with the session, and waiters free it a TTL after the session's
// last heartbeat (heartbeat.go), whatever the lease's last Refresh said.
func (l *lease) StoreDeadline(d time.Time) time.Time {
	if v := l.sess.validUntil(); !d.IsZero() && v.Before(d) {
		return v
	}
	return d
}

// WatchDone implements lockdriver.DoneWatcher: Done is closed on Release,
// when the TTL runs out without a Refresh, when the session lease is
// lost, and — watched from the first call to Done — when the entry is
// deleted by anyone else.
func (l *lease) WatchDone() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.watching && l.State() == lockdriver.Live {
		l.watching = true
		ctx, cancel := context.WithCancel(context.Background())
		l.stopW = cancel
		l.s.bg.Go(func() { l.watchEntry(ctx) })
	}
}

// ended stops the watch and forgets the lease in its session.
func (l *lease) ended() {
	l.mu.Lock()
	if l.stopW != nil {
		l.stopW()
	}
	l.mu.Unlock()
	l.sess.remove(l)
}

// watchEntry ends the lease as lost when its entry disappears.
func (l *lease) watchEntry(ctx context.Context) {
	for ctx.Err() == nil {
		err := l.s.waitDeleted(ctx, l.sess, l.entry)
		if ctx.Err() != nil {
			return
		}
		if err == nil || err == errSessionLost {
			l.End(lockdriver.Lost)
			return
		}
		select { // the watch broke (a server restart): watch again
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
		}
	}
}

// attemptTimeout bounds one attempt to give an entry back. A request that
// reaches a member in the middle of an election can hang until its
// deadline, though the next attempt, to the new leader or another member,
// would succeed at once; an election here takes about a second.
const attemptTimeout = time.Second

// retryUntil runs attempt, each try bounded by attemptTimeout, until it
// succeeds or stop closes, backing off from 50 ms to 2 s between tries.
func retryUntil(stop <-chan struct{}, attempt func(ctx context.Context) error) {
	for wait := 50 * time.Millisecond; ; wait = min(2*wait, 2*time.Second) {
		ctx, cancel := context.WithTimeout(context.Background(), attemptTimeout)
		err := attempt(ctx)
		cancel()
		if err == nil {
			return
		}
		select {
		case <-time.After(wait):
		case <-stop:
			return
		}
	}
}

// undoUnanswered runs undo, retried until it succeeds or stop closes, for
// a transaction whose answer was lost (it may have committed), in the
// background (its caller has its error already) — and once more after
// after: a transaction still on its way to the leader when the first undo
// went out (a request on another stream may overtake it) would otherwise
// leave its writes after all. undo must be harmless when the transaction
// did not commit (it deletes what only that transaction writes).
func (s *Store) undoUnanswered(stop <-chan struct{}, after time.Duration, undo func(ctx context.Context) error) {
	s.bg.Go(func() {
		retryUntil(stop, undo)
		t := time.NewTimer(after)
		defer t.Stop()
		select {
		case <-t.C:
			retryUntil(stop, undo)
		case <-stop:
		}
	})
}

// deleteUntilDone deletes the entry (this lease's own key), retrying until
// it succeeds or the session ends.
func (l *lease) deleteUntilDone() {
	retryUntil(l.sess.done, func(ctx context.Context) error {
		if l.owner != "" {
			_, err := l.s.giveBack(ctx, l)
			return err
		}
		_, err := l.s.c.Delete(ctx, l.entry)
		return err
	})
}

// StoreRefresh implements lockdriver.Store: it checks in one transaction
// that the entry is still ours and records the new expiry in it; the entry
// itself lives as long as the session, which the Store keeps alive.
func (l *lease) StoreRefresh(ctx context.Context, ttl time.Duration) (time.Time, error) {
	if l.passed.Load() {
		return time.Time{}, fmt.Errorf("etcdstore: refresh %q: %w", l.Key(), lock.ErrLockLost)
	}
	start := time.Now()
	// The entry lives on its session (Deadline): renew the session too, in
	// parallel, so that a Refresh moves the lease's validity on both counts.
	// The keep-alive keeps the server's lease; the heartbeat, written in the
	// same transaction as the entry, tells waiters the session was alive
	// after start (heartbeat.go).
	renewed := make(chan time.Duration, 1)
	go func() {
		r, err := l.s.c.KeepAliveOnce(ctx, l.sess.id)
		if err != nil || r.TTL <= 0 {
			renewed <- 0
			return
		}
		renewed <- min(time.Duration(r.TTL)*time.Second, l.sess.ttl)
	}()
	resp, err := l.s.c.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(l.entry), "=", l.rev())).
		Then(clientv3.OpPut(l.entry, expiry(start, ttl), clientv3.WithIgnoreLease()),
			clientv3.OpPut(l.s.heartbeatKey(l.sess.id), strconv.FormatInt(l.sess.ttl.Milliseconds(), 10), clientv3.WithLease(l.sess.id))).
		Commit()
	session := <-renewed
	switch {
	case err != nil:
		return time.Time{}, fmt.Errorf("etcdstore: refresh %q: %w", l.Key(), err)
	case !resp.Succeeded:
		return time.Time{}, fmt.Errorf("etcdstore: refresh %q: %w", l.Key(), lock.ErrLockLost)
	}
	if session > 0 {
		l.sess.setValid(start.Add(session))
	}
	return start.Add(ttl), nil
}

// StoreRelease implements lockdriver.Store: it keeps a hot key's entry for
// the Store's next Acquire (WithLinger), or deletes it in one request.
// Entries are never reused by another acquisition (each writes a key of
// its own; only this Store's own next leases continue a kept one, and a
// lease that passed its entry on never deletes it), so a plain delete
// removes only this lease's entry, and a retried Release can never delete
// a newer holder's.
func (l *lease) StoreRelease(ctx context.Context) error {
	if l.passed.Load() || l.s.keepEntry(l) {
		return nil // kept now, or released already: its entry went on
	}
	// A request cut by a leader election or a lost connection is retried
	// within ctx's budget: a released entry left in the queue would block
	// everyone behind it.
	uncertain := false // an earlier attempt may have deleted the entry
	for backoff := 50 * time.Millisecond; ; backoff = min(2*backoff, time.Second) {
		err := l.release(ctx)
		if uncertain && errors.Is(err, lock.ErrLockLost) {
			return nil // gone: most likely by the attempt whose answer was lost
		}
		if err == nil {
			l.s.recent.LetGo(l.Key())
		}
		if err == nil || errors.Is(err, lock.ErrLockLost) || !retryable(err) {
			return err
		}
		uncertain = true
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			// Out of budget: keep deleting in the background until the
			// entry is gone or the session ends, and report the failure.
			l.s.bg.Go(l.deleteUntilDone)
			return err
		}
	}
}

// retryable reports whether a failed request may succeed when tried again:
// not when the caller's budget is spent or the Store is closed.
func retryable(err error) bool {
	return !errors.Is(err, lock.ErrClosed)
}

func (l *lease) release(ctx context.Context) error {
	rctx, cancel := context.WithTimeout(ctx, attemptTimeout)
	defer cancel()
	ctx = rctx
	var deleted bool
	switch {
	case l.owner != "" && l.State() == lockdriver.Lost:
		// Its expiry already gave this hold back.
	case l.owner != "":
		ok, err := l.s.giveBack(ctx, l)
		if err != nil {
			return fmt.Errorf("etcdstore: release %q: %w", l.Key(), err)
		}
		deleted = ok
	default:
		resp, err := l.s.c.Delete(ctx, l.entry)
		if err != nil {
			return fmt.Errorf("etcdstore: release %q: %w", l.Key(), err)
		}
		deleted = resp.Deleted > 0
	}
	if !deleted {
		return fmt.Errorf("etcdstore: release %q: %w", l.Key(), lock.ErrLockLost)
	}
	return nil
}

// public is l as its holder sees it: nil for no lease.
func (l *lease) public() lock.Lease {
	if l == nil {
		return nil
	}
	return l.Lease()
}
