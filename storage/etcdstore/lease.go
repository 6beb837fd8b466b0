package etcdstore

import (
	"context"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/lock/lockdriver"
)

type leaseState int

const (
	held leaseState = iota
	released
	lost
)

// lease is one held entry. Its key lives as long as the session lease and
// is deleted by Release, by its own TTL running out without a Refresh (the
// Store deletes it then), or by the session ending.
type lease struct {
	s     *Store
	sess  *session
	key   string // the user's key
	entry string // the etcd key of this acquisition
	token string
	rev   int64  // the entry's create revision: the fence
	owner string // set for an owner's hold (lock.WithOwner)
	done  chan struct{}

	mu       sync.Mutex
	state    leaseState
	deadline time.Time
	timer    *time.Timer
	watching bool
	stopW    context.CancelFunc
}

func newLease(s *Store, sess *session, key, entry, tok string, rev int64, deadline time.Time) *lease {
	l := &lease{s: s, sess: sess, key: key, entry: entry, token: tok, rev: rev, done: make(chan struct{}), deadline: deadline}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.timer = time.AfterFunc(time.Until(deadline), l.expire)
	return l
}

func (l *lease) Key() string   { return l.key }
func (l *lease) Token() string { return l.token }
func (l *lease) Fence() uint64 { return uint64(l.rev) }

// Done is closed on Release, when the TTL runs out without a Refresh, when
// the session lease is lost, and — watched from the first call to Done —
// when the entry is deleted by anyone else.
func (l *lease) Done() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.watching && l.state == held {
		l.watching = true
		ctx, cancel := context.WithCancel(context.Background())
		l.stopW = cancel
		l.s.bg.Go(func() { l.watchEntry(ctx) })
	}
	return l.done
}

// watchEntry ends the lease as lost when its entry disappears.
func (l *lease) watchEntry(ctx context.Context) {
	for ctx.Err() == nil {
		err := l.s.waitDeleted(ctx, l.sess, l.entry)
		if ctx.Err() != nil {
			return
		}
		if err == nil || err == errSessionLost {
			l.finish(lost)
			return
		}
		select { // the watch broke (a server restart): watch again
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
		}
	}
}

func (l *lease) expire() {
	l.mu.Lock()
	if l.state == held {
		if d := time.Until(l.deadline); d > 0 {
			l.timer.Reset(d)
			l.mu.Unlock()
			return
		}
	}
	l.mu.Unlock()
	if l.finish(lost) {
		// The TTL ran out: free the key for others now rather than at the
		// end of the session, retrying while the servers are unreachable.
		// An owner's hold gives back only itself.
		l.s.bg.Go(l.deleteUntilDone)
	}
}

// deleteUntilDone deletes the entry (this lease's own key), retrying until
// it succeeds or the session ends.
func (l *lease) deleteUntilDone() {
	for wait := 50 * time.Millisecond; ; wait = min(2*wait, 2*time.Second) {
		ctx, cancel := context.WithTimeout(context.Background(), lockdriver.ReleaseTimeout)
		var err error
		if l.owner != "" {
			_, err = l.s.giveBack(ctx, l)
		} else {
			_, err = l.s.c.Delete(ctx, l.entry)
		}
		cancel()
		if err == nil {
			return
		}
		select {
		case <-time.After(wait):
		case <-l.sess.done:
			return
		}
	}
}

// finish ends the lease; it reports whether this call ended it.
func (l *lease) finish(st leaseState) bool {
	l.mu.Lock()
	if l.state != held {
		l.mu.Unlock()
		return false
	}
	l.state = st
	l.timer.Stop()
	if l.stopW != nil {
		l.stopW()
	}
	close(l.done)
	l.mu.Unlock()
	l.sess.remove(l)
	return true
}

func (l *lease) currentState() leaseState {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.state
}

// Refresh checks in one transaction that the entry is still ours and
// records the new expiry in it; the entry itself lives as long as the
// session, which the Store keeps alive.
func (l *lease) Refresh(ctx context.Context, ttl time.Duration) error {
	if err := lockdriver.ValidateTTL(ttl); err != nil {
		return err
	}
	if l.currentState() != held {
		return fmt.Errorf("etcdstore: refresh %q: %w", l.key, lock.ErrLockLost)
	}
	start := time.Now()
	resp, err := l.s.c.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(l.entry), "=", l.rev)).
		Then(clientv3.OpPut(l.entry, expiry(start, ttl), clientv3.WithIgnoreLease())).
		Commit()
	if err != nil {
		return fmt.Errorf("etcdstore: refresh %q: %w", l.key, err)
	}
	if !resp.Succeeded {
		l.finish(lost)
		return fmt.Errorf("etcdstore: refresh %q: %w", l.key, lock.ErrLockLost)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state != held {
		return fmt.Errorf("etcdstore: refresh %q: %w", l.key, lock.ErrLockLost)
	}
	l.deadline = start.Add(ttl)
	l.timer.Reset(time.Until(l.deadline))
	return nil
}

// Release deletes the entry in one request. Entries are never reused (each
// acquisition writes a key of its own), so a plain delete removes only this
// lease's entry, and a retried Release can never delete a newer holder's. With a cancelled ctx it still runs, under lockdriver.ReleaseTimeout.
func (l *lease) Release(ctx context.Context) error {
	if l.currentState() == released {
		return nil
	}
	if ctx.Err() != nil {
		var cancel context.CancelFunc
		ctx, cancel = lockdriver.CleanupContext(ctx)
		defer cancel()
	}
	var deleted bool
	if l.owner != "" && l.currentState() == lost {
		// Its expiry already gave this hold back.
		return fmt.Errorf("etcdstore: release %q: %w", l.key, lock.ErrLockLost)
	}
	if l.owner != "" {
		ok, err := l.s.giveBack(ctx, l)
		if err != nil {
			return fmt.Errorf("etcdstore: release %q: %w", l.key, err)
		}
		deleted = ok
	} else {
		resp, err := l.s.c.Delete(ctx, l.entry)
		if err != nil {
			return fmt.Errorf("etcdstore: release %q: %w", l.key, err)
		}
		deleted = resp.Deleted > 0
	}
	if !deleted {
		l.finish(lost)
		if l.currentState() == released {
			return nil
		}
		return fmt.Errorf("etcdstore: release %q: %w", l.key, lock.ErrLockLost)
	}
	if !l.finish(released) {
		l.mu.Lock()
		l.state = released // lost locally, but the entry was still ours: now gone
		l.mu.Unlock()
	}
	return nil
}
