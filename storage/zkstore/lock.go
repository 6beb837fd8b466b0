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
	"github.com/oncekit/oncekit/core/observe"
	"github.com/oncekit/oncekit/storage/internal/token"
)

const lostState = lockdriver.Lost

// seqLen is the length of the sequence number ZooKeeper appends to a
// sequential node's name.
const seqLen = 10

// TryAcquire implements lock.Locker: two requests when the key is free
// (the node made, the queue listed), four when it is held by another (and
// the node deleted again, the holder's remaining TTL read).
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
	if err := s.closedErr("acquire", key); err != nil {
		return nil, err
	}
	dir := s.lockDir(key)
	if owner != "" {
		// An owner first looks whether it holds the key already, here or
		// in another process: it must not queue behind waiters for its
		// own lock.
		l, err := s.reenter(ctx, key, dir, ttl, owner)
		if l != nil || err != nil {
			return l, err
		}
	}
	// A TryAcquire joins the queue as an Acquire does and leaves it at once
	// when the key is taken: a write, after which this session's server
	// has applied every earlier change, so that a release another
	// session's server confirmed before this call began is seen. (A read
	// is served by the session's server alone, which may not have applied
	// it yet; a sync with the leader before the read narrowed that window
	// but did not close it on a busy ensemble.)
	for {
		l, err := s.enqueue(ctx, key, dir, ttl, owner, wait)
		if !errors.Is(err, errRequeue) {
			return l, err
		}
	}
}

// reenter gives owner a hold on the key if owner holds it already: a
// re-entry node, "~r-<anchor>-<id>", beside the holder's, with its token
// and fence. A re-entry node is anchored at the queue node of the hold it
// joined (its sequence number); the key is held while that node or any of
// its re-entry nodes lasts. It returns nil when owner does not hold the key.
func (s *Store) reenter(ctx context.Context, key, dir string, ttl time.Duration, owner string) (lock.Lease, error) {
	start := time.Now()
	sn, err := s.children(ctx, dir)
	if err != nil {
		return nil, s.acquireErr(ctx, key, err)
	}
	first, _ := sn.holders()
	if first == "" {
		return nil, nil
	}
	h, st, err := s.getLock(ctx, dir+"/"+first)
	if errors.Is(err, zk.ErrNoNode) || errors.Is(err, errOtherLayout) {
		return nil, nil // let go meanwhile, or another layout's: not owner's
	}
	if err != nil {
		return nil, s.acquireErr(ctx, key, err)
	}
	if h.owner != owner {
		return nil, nil
	}
	fence := h.fence
	if fence == 0 {
		fence = uint64(st.Czxid)
	}
	anchor := anchorOf(first)
	gen := s.generation()
	node := dir + "/" + holdPrefix + anchor + "-" + token.New()
	data := lockData(lockInfo{ttl: ttl, fence: fence, token: h.token, owner: owner})
	_, err = call(ctx, s, func() (string, error) {
		return s.conn.Create(node, data, zk.FlagEphemeral, zk.WorldACL(zk.PermAll))
	}, func(_ string, err error) {
		if err == nil {
			s.deleteNow(context.Background(), node)
		}
	})
	if err != nil {
		if ctx.Err() == nil && !errors.Is(err, zk.ErrNoNode) {
			s.forget(node)
		}
		return nil, s.acquireErr(ctx, key, err)
	}
	// The hold it joined must still be there: its queue node, or another
	// of its re-entry nodes.
	sn, err = s.children(ctx, dir)
	if err != nil {
		s.deleteNow(ctx, node)
		return nil, s.acquireErr(ctx, key, err)
	}
	joined := false
	for _, n := range append(sn.queue, sn.holds...) {
		if n != node[len(dir)+1:] && anchorOf(n) == anchor {
			joined = true
		}
	}
	if !joined {
		s.deleteNow(ctx, node)
		return nil, nil
	}
	if l := s.grant(key, h.token, node, fence, gen, start, ttl, owner, fence); l != nil {
		return l.Lease(), nil
	}
	s.deleteNow(ctx, node)
	return nil, nil
}

// deleteNow deletes node before it returns, so that its key is free for
// the next caller at once, within the clean-up bound of ctx; a node the
// ensemble cannot delete now is left to the Store's sweeps (forget).
func (s *Store) deleteNow(ctx context.Context, node string) {
	cctx, cancel := lockdriver.CleanupContext(ctx)
	defer cancel()
	_, err := call(cctx, s, func() (struct{}, error) { return struct{}{}, s.conn.Delete(node, -1) }, nil)
	if err != nil && !errors.Is(err, zk.ErrNoNode) {
		s.forget(node)
	}
}

// deleteVersion deletes path if it is still at version: a claim whose
// caller gave up before its answer came. Within the clean-up bound; a
// failure leaves the claim to its lease.
func (s *Store) deleteVersion(path string, version int32) {
	cctx, cancel := lockdriver.CleanupContext(context.Background())
	defer cancel()
	_, _ = call(cctx, s, func() (struct{}, error) { return struct{}{}, s.conn.Delete(path, version) }, nil)
}

// errRequeue: the acquisition's node went with a lost session; it joins
// the queue again.
var errRequeue = errors.New("requeue")

// enqueue creates the acquisition's node and waits for its turn (or, not
// waiting, gives up unless it is first at once).
func (s *Store) enqueue(ctx context.Context, key, dir string, ttl time.Duration, owner string, wait bool) (lock.Lease, error) {
	start := time.Now()
	began := start
	tok := token.New()
	gen := s.generation()
	node, fence, err := s.create(ctx, dir, tok, ttl, owner)
	if err != nil {
		return nil, s.acquireErr(ctx, key, err)
	}
	name := node[len(dir)+1:]
	// giveUp deletes the node before the call returns, so that the key is
	// free for the next caller at once; one the ensemble cannot delete now
	// is left to the Store's sweeps.
	giveUp := func() { s.deleteNow(ctx, node) }
	recheck := time.NewTimer(s.timeout)
	defer recheck.Stop()
	for waited := false; ; waited = true {
		// The lease counts from when the key became this acquisition's,
		// not from when it began waiting (a lease counted from before a
		// wait longer than its TTL would be born ended): from before the
		// node was made when it was first at once, else from before the
		// listing that found it first. Nobody else times the lease: its
		// node stays first until it is deleted or its session ends.
		if waited {
			start = time.Now()
		}
		sn, err := s.children(ctx, dir)
		if err != nil {
			giveUp()
			return nil, s.acquireErr(ctx, key, err)
		}
		first, _ := sn.holders()
		i := slices.Index(sn.queue, name)
		switch {
		case i < 0: // the session that created it expired
			return nil, errRequeue
		case first == name:
			if l := s.grant(key, tok, node, fence, gen, start, ttl, owner, 0); l != nil {
				if waited {
					observe.Record(ctx, s.observer, observe.Event{
						Op: observe.LockHandOff, Driver: driverName, Key: key, Outcome: observe.Notified,
						Fence: fence, Duration: time.Since(began),
					})
				}
				return l.Lease(), nil
			}
			giveUp()
			return nil, errRequeue
		case !wait:
			giveUp()
			return nil, s.busy(ctx, key, dir, first)
		}
		// Wait for the node before it in the queue, or, first in it, for
		// the re-entry holds of the hold before it.
		pred := first
		if i > 0 {
			pred = sn.queue[i-1]
		}
		pred = dir + "/" + pred
		ok, ch, err := s.existsW(ctx, pred)
		if err != nil {
			giveUp()
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
			giveUp()
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
func (s *Store) create(ctx context.Context, dir, tok string, ttl time.Duration, owner string) (string, uint64, error) {
	data := lockData(lockInfo{ttl: ttl, token: tok, owner: owner})
	undo := func(r []zk.MultiResponse, err error) { // the node of a call ctx gave up on
		if err == nil && len(r) == 2 && r[0].Error == nil {
			s.deleteNow(context.Background(), r[0].String)
		}
	}
	for range 8 {
		r, err := call(ctx, s, func() ([]zk.MultiResponse, error) {
			return s.conn.Multi(
				&zk.CreateRequest{Path: dir + "/" + tok + "-", Data: data, Acl: zk.WorldACL(zk.PermAll), Flags: zk.FlagEphemeral | zk.FlagSequence},
				&zk.SetDataRequest{Path: dir, Data: nil, Version: -1},
			)
		}, undo)
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
			// undo.)
			return "", 0, err
		}
		if len(r) != 2 || r[1].Stat == nil {
			return "", 0, fmt.Errorf("unexpected multi reply %+v", r)
		}
		return r[0].String, uint64(r[1].Stat.Mzxid), nil
	}
	return "", 0, errors.New("the key's directory kept disappearing")
}

// children lists dir's queue and re-entry holds (empty for a missing
// directory).
func (s *Store) children(ctx context.Context, dir string) (snapshot, error) {
	kids, err := call(ctx, s, func() ([]string, error) {
		kids, _, err := s.conn.Children(dir)
		return kids, err
	}, nil)
	if errors.Is(err, zk.ErrNoNode) {
		return snapshot{}, nil
	}
	if err != nil {
		return snapshot{}, err
	}
	return snapshotOf(kids), nil
}

// holdPrefix starts a re-entry node's name (tokens never hold '~').
const holdPrefix = "~r-"

// snapshot is a key's acquisitions as listed: the queue nodes in queue
// order (by the sequence number that ends each name) and the re-entry
// nodes.
type snapshot struct {
	queue, holds []string
}

func snapshotOf(kids []string) snapshot {
	var sn snapshot
	for _, k := range kids {
		switch {
		case strings.HasPrefix(k, holdPrefix) && len(k) > len(holdPrefix)+seqLen:
			sn.holds = append(sn.holds, k)
		case !strings.HasPrefix(k, holdPrefix) && len(k) > seqLen+1:
			sn.queue = append(sn.queue, k)
		}
	}
	slices.SortFunc(sn.queue, func(a, b string) int { return strings.Compare(a[len(a)-seqLen:], b[len(b)-seqLen:]) })
	slices.Sort(sn.holds)
	return sn
}

// anchorOf is the sequence number of the hold a node belongs to: its own
// for a queue node, its anchor's for a re-entry node.
func anchorOf(name string) string {
	if strings.HasPrefix(name, holdPrefix) {
		return name[len(holdPrefix) : len(holdPrefix)+seqLen]
	}
	return name[len(name)-seqLen:]
}

func (sn snapshot) holders() (first string, group []string) {
	head := ""
	if len(sn.queue) > 0 {
		head = anchorOf(sn.queue[0])
	}
	for _, h := range sn.holds {
		if anchorOf(h) != head { // left by a hold whose queue node went first
			group = append(group, h)
		}
	}
	if len(group) > 0 {
		return group[0], group
	}
	if len(sn.queue) == 0 {
		return "", nil
	}
	return sn.queue[0], append([]string{sn.queue[0]}, sn.holds...)
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
	if h, st, err := s.getLock(ctx, dir+"/"+first); err == nil {
		ttl = h.remaining(st)
	}
	return &lock.BusyError{Key: key, TTL: ttl}
}

func (s *Store) acquireErr(ctx context.Context, key string, err error) error {
	if ctx.Err() != nil {
		return lockdriver.NotAcquired(ctx)
	}
	if s.isClosed() {
		return fmt.Errorf("zkstore: acquire %q: %w (%w)", key, lock.ErrClosed, err)
	}
	return fmt.Errorf("zkstore: acquire %q: %w", key, err)
}

// isClosed reports whether Close was called.
func (s *Store) isClosed() bool {
	select {
	case <-s.closing:
		return true
	default:
		return false
	}
}

// closedErr reports a call op on key after Close (lock.ErrClosed), nil
// before.
func (s *Store) closedErr(op, key string) error {
	if !s.isClosed() {
		return nil
	}
	return fmt.Errorf("zkstore: %s %q: %w", op, key, lock.ErrClosed)
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
func (s *Store) grant(key, tok, node string, fence uint64, gen int64, start time.Time, ttl time.Duration, owner string, reFence uint64) *lease {
	l := &lease{s: s, node: node, owner: owner, reFence: reFence}
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
	lockdriver.Control
	s     *Store
	node  string
	watch sync.Once
	cut   atomic.Bool // ended with the session's connection: the Store deletes its node
	owner string      // lock.WithOwner's, or ""
	// reFence is the hold's fence written in a re-entry node's data (0 for
	// a queue node, whose fence is its creation's zxid).
	reFence uint64
}

// WatchDone implements lockdriver.DoneWatcher: besides a Release, the
// local deadline and a session that may be lost, the lease ends when
// anyone else deletes the node (an operator's ForceRelease), watched from
// the first time Done is called.
func (l *lease) WatchDone() {
	done := l.Control.Ended()
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
}

// StoreRefresh implements lockdriver.Store: it records the new TTL on the
// node (for other processes to read) and checks the node is still there.
func (l *lease) StoreRefresh(ctx context.Context, ttl time.Duration) (time.Time, error) {
	if l.cut.Load() {
		return time.Time{}, fmt.Errorf("zkstore: refresh %q: %w (the session's connection was lost)", l.Key(), lock.ErrLockLost)
	}
	start := time.Now()
	data := lockData(lockInfo{ttl: ttl, fence: l.reFence, token: l.Token(), owner: l.owner})
	_, err := call(ctx, l.s, func() (*zk.Stat, error) { return l.s.conn.Set(l.node, data, -1) }, nil)
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

// lockInfo is an acquisition node's data, of layout v1 (oncekit v0.1.0's):
// "v1|<ttl ms>|<fence>|<token>|<owner>". A node holds its key by its place
// in the queue, whatever its data: a node of another layout is a holder
// or a waiter this version does not know.
// A queue node's fence is 0 (its own creation's zxid, czxid); a re-entry
// node carries its hold's token and fence.
type lockInfo struct {
	ttl   time.Duration
	fence uint64
	token string
	owner string
}

func lockData(i lockInfo) []byte {
	return []byte("v1|" + strconv.FormatInt(i.ttl.Milliseconds(), 10) + "|" + strconv.FormatUint(i.fence, 10) + "|" + i.token + "|" + i.owner)
}

func parseLockData(b []byte) (lockInfo, bool) {
	rest, ok := strings.CutPrefix(string(b), "v1|")
	if !ok {
		return lockInfo{}, false
	}
	f := strings.SplitN(rest, "|", 4)
	if len(f) != 4 {
		return lockInfo{}, false
	}
	ms, err1 := strconv.ParseInt(f[0], 10, 64)
	fence, err2 := strconv.ParseUint(f[1], 10, 64)
	if err1 != nil || err2 != nil || ms <= 0 || f[2] == "" {
		return lockInfo{}, false
	}
	return lockInfo{ttl: time.Duration(ms) * time.Millisecond, fence: fence, token: f[2], owner: f[3]}, true
}

// remaining is the TTL left of a node written at st.Mtime (the servers'
// clock), read with this process's clock, within (0, ttl].
func (i lockInfo) remaining(st *zk.Stat) time.Duration {
	return min(max(time.Until(time.UnixMilli(st.Mtime).Add(i.ttl)), time.Millisecond), i.ttl)
}

// getLock reads an acquisition node.
func (s *Store) getLock(ctx context.Context, path string) (lockInfo, *zk.Stat, error) {
	data, st, err := s.get(ctx, path)
	if err != nil {
		return lockInfo{}, nil, err
	}
	i, ok := parseLockData(data)
	if !ok {
		return lockInfo{}, st, fmt.Errorf("%s: %w", path, errOtherLayout)
	}
	return i, st, nil
}

// errOtherLayout is an acquisition node whose data is not of layout v1
// (another version's, or not oncekit's): it holds its place in the queue
// like any other, and this version reads nothing else from it.
var errOtherLayout = errors.New("holds no data of layout v1")

var (
	_ lock.Locker            = (*Store)(nil)
	_ lockdriver.Store       = (*lease)(nil)
	_ lockdriver.DoneWatcher = (*lease)(nil)
)
