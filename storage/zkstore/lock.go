package zkstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/lock/lockdriver"
	"github.com/oncekit/oncekit/storage/internal/token"
)

const lostState = lockdriver.Lost

// seqLen is the length of the sequence number ZooKeeper appends to a
// sequential node's name.
const seqLen = 10

// TryAcquire implements lock.Locker: one request when the key is held by
// another (two to report its remaining TTL), three when it is free.
func (s *Store) TryAcquire(ctx context.Context, key string, ttl time.Duration) (lock.Lease, error) {
	return s.acquire(ctx, key, ttl, false)
}

// Acquire implements lock.Locker: it joins the key's queue of
// acquisitions and waits for the one just before it to go.
func (s *Store) Acquire(ctx context.Context, key string, ttl time.Duration) (lock.Lease, error) {
	return s.acquire(ctx, key, ttl, true)
}

func (s *Store) acquire(ctx context.Context, key string, ttl time.Duration, wait bool) (lock.Lease, error) {
	owner, err := lockdriver.CheckAcquire(ctx, key, ttl)
	if err != nil {
		return nil, err
	}
	if owner != "" {
		return nil, fmt.Errorf("zkstore: acquire %q: %w", key, lock.ErrReentrancyUnsupported)
	}
	dir := s.lockDir(key)
	if !wait {
		// A key with anyone queued is not free: the first in the queue
		// holds it or is about to.
		kids, err := s.children(ctx, dir)
		if err != nil {
			return nil, s.acquireErr(ctx, key, err)
		}
		if len(kids) > 0 {
			return nil, s.busy(ctx, key, dir, kids[0])
		}
	}
	for {
		l, err := s.enqueue(ctx, key, dir, ttl, wait)
		if !errors.Is(err, errRequeue) {
			return l, err
		}
	}
}

// errRequeue: the acquisition's node went with a lost session; it joins
// the queue again.
var errRequeue = errors.New("requeue")

// enqueue creates the acquisition's node and waits for its turn (or, not
// waiting, gives up unless it is first at once).
func (s *Store) enqueue(ctx context.Context, key, dir string, ttl time.Duration, wait bool) (lock.Lease, error) {
	start := time.Now()
	tok := token.New()
	gen := s.generation()
	node, fence, err := s.create(ctx, dir, tok, ttl)
	if err != nil {
		return nil, s.acquireErr(ctx, key, err)
	}
	name := node[len(dir)+1:]
	giveUp := func() { s.forget(node) }
	recheck := time.NewTimer(s.timeout)
	defer recheck.Stop()
	for {
		kids, err := s.children(ctx, dir)
		if err != nil {
			s.bg.Go(giveUp)
			return nil, s.acquireErr(ctx, key, err)
		}
		i := slices.Index(kids, name)
		switch {
		case i < 0: // the session that created it expired
			return nil, errRequeue
		case i == 0:
			if l := s.grant(key, tok, node, fence, gen, start, ttl); l != nil {
				return l, nil
			}
			s.bg.Go(giveUp)
			return nil, errRequeue
		case !wait:
			s.bg.Go(giveUp)
			return nil, s.busy(ctx, key, dir, kids[0])
		}
		pred := dir + "/" + kids[i-1]
		ok, ch, err := s.existsW(ctx, pred)
		if err != nil {
			s.bg.Go(giveUp)
			return nil, s.acquireErr(ctx, key, err)
		}
		if !ok {
			continue
		}
		recheck.Reset(s.timeout)
		select {
		case <-ch:
		case <-recheck.C: // a watch lost with a connection: look again
		case <-ctx.Done():
			s.bg.Go(giveUp)
			return nil, lockdriver.NotAcquired(ctx)
		}
	}
}

// create writes the acquisition's ephemeral sequential node,
// "<dir>/<token>-<sequence>", and returns its path and fence: the
// transaction's zxid, which ZooKeeper issues in one order for the whole
// ensemble, so a later node's is higher whatever happened to the key's
// directory in between. The directory is a container node (the servers
// delete it once empty); it is created when missing.
func (s *Store) create(ctx context.Context, dir, tok string, ttl time.Duration) (string, uint64, error) {
	data := lockData(ttl, tok)
	late := func(r []zk.MultiResponse, err error) { // the node of a call ctx gave up on
		if err == nil && len(r) == 2 && r[0].Error == nil {
			s.forget(r[0].String)
		}
	}
	for range 8 {
		r, err := call(ctx, s, func() ([]zk.MultiResponse, error) {
			return s.conn.Multi(
				&zk.CreateRequest{Path: dir + "/" + tok + "-", Data: data, Acl: zk.WorldACL(zk.PermAll), Flags: zk.FlagEphemeral | zk.FlagSequence},
				&zk.SetDataRequest{Path: dir, Data: nil, Version: -1},
			)
		}, late)
		if errors.Is(err, zk.ErrNoNode) {
			_, err := call(ctx, s, func() (string, error) {
				return s.conn.CreateContainer(dir, nil, zk.FlagContainer, zk.WorldACL(zk.PermAll))
			}, nil)
			if err != nil && !errors.Is(err, zk.ErrNodeExists) {
				return "", 0, err
			}
			continue // the directory may be reaped again before the retry: bounded
		}
		if err != nil {
			if !errors.Is(err, zk.ErrNodeExists) && !errors.Is(err, zk.ErrNoNode) && ctx.Err() == nil {
				s.forgetCreated(dir, tok) // the reply may have been lost after the node was made
			}
			// (A create whose reply a cancelled ctx gave up on is deleted by
			// late.)
			return "", 0, err
		}
		if len(r) != 2 || r[1].Stat == nil {
			return "", 0, fmt.Errorf("unexpected multi reply %+v", r)
		}
		return r[0].String, uint64(r[1].Stat.Mzxid), nil
	}
	return "", 0, errors.New("the key's directory kept disappearing")
}

// children lists dir's acquisitions in queue order (an empty list for a
// missing directory).
func (s *Store) children(ctx context.Context, dir string) ([]string, error) {
	kids, err := call(ctx, s, func() ([]string, error) {
		kids, _, err := s.conn.Children(dir)
		return kids, err
	}, nil)
	if errors.Is(err, zk.ErrNoNode) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return sortQueue(kids), nil
}

// sortQueue puts a key's acquisitions in queue order: by the sequence
// number that ends each name.
func sortQueue(kids []string) []string {
	kids = slices.DeleteFunc(kids, func(k string) bool { return len(k) <= seqLen+1 })
	slices.SortFunc(kids, func(a, b string) int { return strings.Compare(a[len(a)-seqLen:], b[len(b)-seqLen:]) })
	return kids
}

func (s *Store) existsW(ctx context.Context, path string) (bool, <-chan zk.Event, error) {
	type res struct {
		ok bool
		ch <-chan zk.Event
	}
	r, err := call(ctx, s, func() (res, error) {
		ok, _, ch, err := s.conn.ExistsW(path)
		return res{ok, ch}, err
	}, nil)
	return r.ok, r.ch, err
}

// busy is the BusyError for a key whose first acquisition is first: with
// the holder's remaining TTL, by its node's last write (the servers' clock)
// and this process's clock, or -1 when it cannot be read.
func (s *Store) busy(ctx context.Context, key, dir, first string) error {
	ttl := time.Duration(-1)
	type res struct {
		data []byte
		st   *zk.Stat
	}
	if r, err := call(ctx, s, func() (res, error) {
		d, st, err := s.conn.Get(dir + "/" + first)
		return res{d, st}, err
	}, nil); err == nil {
		if held, _, ok := parseLockData(r.data); ok {
			left := time.Until(time.UnixMilli(r.st.Mtime).Add(held))
			ttl = min(max(left, time.Millisecond), held)
		}
	}
	return &lock.BusyError{Key: key, TTL: ttl}
}

func (s *Store) acquireErr(ctx context.Context, key string, err error) error {
	if ctx.Err() != nil {
		return lockdriver.NotAcquired(ctx)
	}
	return fmt.Errorf("zkstore: acquire %q: %w", key, err)
}

// generation counts the disconnections: a lease taken across one may have
// lost its session, and is not granted.
func (s *Store) generation() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gen
}

// grant makes the lease of the node that is first in its queue, unless the
// session was interrupted since the node was created (it may be gone).
func (s *Store) grant(key, tok, node string, fence uint64, gen int64, start time.Time, ttl time.Duration) *lease {
	l := &lease{s: s, node: node}
	l.Init(lockdriver.Config{
		Driver: "zkstore", Key: key, Token: tok, Fence: fence, Deadline: start.Add(ttl), Store: l,
		OnEnd: func(lockdriver.State) {
			s.mu.Lock()
			delete(s.leases, l)
			s.mu.Unlock()
		},
		OnExpire: func() { s.forget(node) },
	})
	s.mu.Lock()
	ok := s.gen == gen && !s.closed
	if ok {
		s.leases[l] = struct{}{}
	}
	s.mu.Unlock()
	if !ok {
		l.EndQuietly(lostState)
		return nil
	}
	return l
}

// lease is a held acquisition: its node in the key's queue.
type lease struct {
	lockdriver.Lease
	s     *Store
	node  string
	watch sync.Once
	cut   atomic.Bool // ended with the session's connection: the Store deletes its node
}

// Done implements lock.Lease. Besides a Release, the local deadline and a
// session that may be lost, it closes when anyone else deletes the node
// (an operator's ForceRelease): a watch on the node is set the first time
// Done is called.
func (l *lease) Done() <-chan struct{} {
	done := l.Lease.Done()
	l.watch.Do(func() {
		select {
		case <-done:
			return
		default:
		}
		l.s.bg.Go(func() {
			ok, _, ch, err := l.s.conn.ExistsW(l.node)
			switch {
			case err == nil && !ok:
				l.End(lostState)
			case err == nil:
				select {
				case ev := <-ch:
					if ev.Type == zk.EventNodeDeleted || ev.Type == zk.EventNotWatching {
						l.End(lostState)
					}
				case <-done:
				}
			}
		})
	})
	return done
}

// StoreRefresh implements lockdriver.Store: it records the new TTL on the
// node (for other processes to read) and checks the node is still there.
func (l *lease) StoreRefresh(ctx context.Context, ttl time.Duration) (time.Time, error) {
	if l.cut.Load() {
		return time.Time{}, fmt.Errorf("zkstore: refresh %q: %w (the session's connection was lost)", l.Key(), lock.ErrLockLost)
	}
	start := time.Now()
	_, err := call(ctx, l.s, func() (*zk.Stat, error) { return l.s.conn.Set(l.node, lockData(ttl, l.Token()), -1) }, nil)
	switch {
	case errors.Is(err, zk.ErrNoNode):
		return time.Time{}, fmt.Errorf("zkstore: refresh %q: %w", l.Key(), lock.ErrLockLost)
	case err != nil:
		return time.Time{}, fmt.Errorf("zkstore: refresh %q: %w", l.Key(), err)
	}
	return start.Add(ttl), nil
}

// StoreRelease implements lockdriver.Store: it deletes the node, which
// wakes the next acquisition in the queue (only that one).
func (l *lease) StoreRelease(ctx context.Context) error {
	if l.cut.Load() {
		return fmt.Errorf("zkstore: release %q: %w (the session's connection was lost)", l.Key(), lock.ErrLockLost)
	}
	_, err := call(ctx, l.s, func() (struct{}, error) { return struct{}{}, l.s.conn.Delete(l.node, -1) }, nil)
	switch {
	case errors.Is(err, zk.ErrNoNode):
		return fmt.Errorf("zkstore: release %q: %w", l.Key(), lock.ErrLockLost)
	case err != nil:
		return fmt.Errorf("zkstore: release %q: %w", l.Key(), err)
	}
	return nil
}

// lockData is an acquisition node's data: "v1|<ttl ms>|<token>".
func lockData(ttl time.Duration, tok string) []byte {
	return []byte("v1|" + strconv.FormatInt(ttl.Milliseconds(), 10) + "|" + tok)
}

func parseLockData(b []byte) (ttl time.Duration, tok string, ok bool) {
	rest, ok := strings.CutPrefix(string(b), "v1|")
	if !ok {
		return 0, "", false
	}
	ms, tok, ok := strings.Cut(rest, "|")
	n, err := strconv.ParseInt(ms, 10, 64)
	if !ok || err != nil || n <= 0 {
		return 0, "", false
	}
	return time.Duration(n) * time.Millisecond, tok, true
}

var _ lock.Locker = (*Store)(nil)
