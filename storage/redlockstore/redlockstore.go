package redlockstore

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/observe"
	"github.com/oncekit/oncekit/internal/bg"
	"github.com/oncekit/oncekit/internal/keyq"
	"github.com/oncekit/oncekit/internal/redislua"
	"github.com/oncekit/oncekit/internal/redisnotify"
	"github.com/oncekit/oncekit/internal/token"
)

// Client is the part of go-redis each node's client must offer;
// *redis.Client satisfies it. Each node is an independent Redis server
// (not replicas of one another, not one Cluster).
type Client interface {
	redis.Scripter
	Subscribe(ctx context.Context, channels ...string) *redis.PubSub
	SSubscribe(ctx context.Context, channels ...string) *redis.PubSub
	Info(ctx context.Context, section ...string) *redis.StringCmd
}

// Store is a lock.Locker over N independent Redis nodes with majority
// quorum. It is safe for concurrent use; Close releases its pub/sub
// connections.
type Store struct {
	nodes  []*node
	quorum int
	opts   options
	names  redislua.Keys
	local  keyq.Queue // one competitor per key in this Store

	bg        bg.Group // requests past their round, and their clean-up
	closed    chan struct{}
	closeOnce sync.Once

	id string // this Store's name in the keys' waiting queues
}

type node struct {
	name string
	c    Client
	sub  *redisnotify.Subscriber
}

// New returns a Store over clients, one per node. There must be an odd
// number of at least 3. New makes no request.
func New(clients []Client, opts ...Option) (*Store, error) {
	if n := len(clients); n < 3 || n%2 == 0 {
		return nil, fmt.Errorf("redlockstore: New: %d nodes; need an odd number, at least 3", n)
	}
	o := defaultOptions()
	for _, opt := range opts {
		opt(&o)
	}
	if err := o.validate(); err != nil {
		return nil, fmt.Errorf("redlockstore: New: %w", err)
	}
	s := &Store{
		quorum: len(clients)/2 + 1,
		opts:   o,
		names:  redislua.Keys{Prefix: o.prefix},
		closed: make(chan struct{}),
		id:     token.New(),
	}
	seen := map[string]bool{}
	for i, c := range clients {
		if c == nil {
			return nil, fmt.Errorf("redlockstore: New: client %d is nil", i)
		}
		name := fmt.Sprintf("node %d", i)
		if oc, ok := c.(interface{ Options() *redis.Options }); ok {
			name = oc.Options().Addr
			if seen[name] {
				return nil, fmt.Errorf("redlockstore: New: %s is given twice; the nodes must be independent", name)
			}
			seen[name] = true
		}
		s.nodes = append(s.nodes, &node{name: name, c: c, sub: redisnotify.New(c, o.pubsub)})
	}
	return s, nil
}

// Quorum is the number of nodes an operation must reach: N/2 + 1.
func (s *Store) Quorum() int { return s.quorum }

// Close closes the pub/sub connections, wakes waiters (they fail with
// lock.ErrClosed), and waits for requests still in flight to finish their
// clean-up. It does not close the clients.
func (s *Store) Close() error {
	var errs []error
	s.closeOnce.Do(func() {
		close(s.closed)
		for _, n := range s.nodes {
			errs = append(errs, n.sub.Close())
		}
	})
	s.bg.Wait()
	return errors.Join(errs...)
}

func (s *Store) nodeTimeout(ttl time.Duration) time.Duration {
	if s.opts.nodeTimeout > 0 {
		return s.opts.nodeTimeout
	}
	return min(max(ttl/10, 50*time.Millisecond), time.Second)
}

func (s *Store) drift(ttl time.Duration) time.Duration {
	return time.Duration(float64(ttl)*s.opts.driftFactor) + s.opts.driftFloor
}

// reply is one node's answer in a round.
type reply struct {
	i   int
	v   []int64
	err error
}

// call sends run to the nodes in idx at once, each on its own goroutine
// (tracked by s.bg, so nothing outlives Close), and returns their replies.
// Requests use the clients' own timeouts; rounds stop waiting on their own
// schedule (collect).
func (s *Store) call(idx []int, run func(ctx context.Context, n *node) ([]int64, error)) <-chan reply {
	ch := make(chan reply, len(idx))
	for _, i := range idx {
		s.bg.Go(func() {
			v, err := run(context.Background(), s.nodes[i])
			ch <- reply{i: i, v: v, err: err}
		})
	}
	return ch
}

// collect reads up to n replies until decided returns true, timeout passes
// or ctx ends. It returns how many replies it did not read and whether the
// timeout passed.
func collect(ctx context.Context, ch <-chan reply, n int, timeout time.Duration, decided func(reply) bool) (pending int, timedOut bool, ctxErr error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for pending = n; pending > 0; {
		select {
		case r := <-ch:
			pending--
			if decided(r) {
				return pending, false, nil
			}
		case <-t.C:
			return pending, true, nil
		case <-ctx.Done():
			return pending, false, ctx.Err()
		}
	}
	return 0, false, nil
}

func (s *Store) all() []int {
	idx := make([]int, len(s.nodes))
	for i := range idx {
		idx[i] = i
	}
	return idx
}

// outcome of one acquisition attempt.
type outcome struct {
	lease  *lease
	held   *lock.HeldError // the key is held: wait for it
	split  bool            // we took some nodes, not a majority
	leader bool            // ... including the key's leader node
	rival  bool            // another token holds the leader node
	err    error           // a *QuorumError, a ctx error, or a failed fencing round
	taken  []int           // the nodes the round took (a lease's majority)
}

// claim is one token's hold on the nodes, across the attempts that use it.
// It knows every node the token took, including ones whose answer came
// after their round had ended, so that whatever happens to the attempts
// nothing is left behind: an abandoned claim releases all of them, and so
// does a late answer after the claim was abandoned or its lease ended.
type claim struct {
	s   *Store
	key string
	tok string

	mu        sync.Mutex
	held      map[int]bool
	abandoned bool
	lease     *lease
}

func (s *Store) newClaim(key string) *claim {
	return &claim{s: s, key: key, tok: token.New(), held: map[int]bool{}}
}

// took records that node i holds the claim's token; it reports false (and
// releases the node) when the claim is already over.
func (c *claim) took(i int) bool {
	c.mu.Lock()
	over := c.abandoned || (c.lease != nil && c.lease.finished())
	if !over {
		c.held[i] = true
	}
	c.mu.Unlock()
	if over {
		c.s.releaseNodes(c.key, c.tok, []int{i}, 0)
	}
	return !over
}

// abandon releases every node the claim took, waiting up to wait. With
// quiet set it publishes no release message: a split-vote loser giving its
// nodes back to the leader-node holder should not wake every other waiter.
func (c *claim) abandon(wait time.Duration, quiet bool) {
	c.mu.Lock()
	c.abandoned = true
	idx := make([]int, 0, len(c.held))
	for i := range c.held {
		idx = append(idx, i)
	}
	c.held = map[int]bool{}
	c.mu.Unlock()
	if len(idx) > 0 {
		mode := c.s.opts.pubsub.ScriptArg()
		if quiet {
			mode = redisnotify.Off.ScriptArg()
		}
		c.s.releaseNodesMode(c.key, c.tok, idx, wait, mode)
	}
}

// leaderNode is the node whose holder wins a split vote on key: every
// client agrees on it, and one client at a time can hold it.
func (s *Store) leaderNode(key string) int {
	h := fnv.New32a()
	h.Write([]byte(key))
	return int(h.Sum32() % uint32(len(s.nodes)))
}

// attempt makes one Redlock acquisition round for claim c: it takes the
// key on every node it can (SET NX PX and an INCR of the node's fence
// counter, or a renewal where the claim's token already holds it). With a
// majority and validity left, the second round (fenced mode) writes the
// highest counter back and needs a majority too. On failure the caller
// decides whether to keep the claim for another round or abandon it.
//
// A waiter passes its queue member (the Store's id): on the nodes where
// the key is held it joins the key's waiting queue, keeping its first
// place, and a release there wakes only the first live member.
func (s *Store) attempt(ctx context.Context, c *claim, ttl time.Duration, onEnd func(), member string, place int64) outcome {
	key := c.key
	owner := lock.Owner(ctx)
	start := time.Now()
	nt := s.nodeTimeout(ttl)
	deadline := start.Add(nt)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	fenced := 0
	if s.opts.fenced {
		fenced = 1
	}
	keys := []string{s.names.Lock(key), s.names.Fence(key), s.names.Owner(key)}
	args := []any{c.tok, ttl.Milliseconds(), deadline.UnixMilli(), fenced, owner}
	if member != "" {
		keys = append(keys, s.names.Queue(key), s.names.QueueExpiry(key))
		args = append(args, member, (3 * s.opts.recheck).Milliseconds(), place)
	}
	n := len(s.nodes)
	reTok := make([]string, n) // the owner's token, for nodes that re-entered
	ch := s.call(s.all(), func(cx context.Context, nd *node) ([]int64, error) {
		i := slices.Index(s.nodes, nd)
		r, err := redislua.ParseAcquire(redislua.Acquire.Run(cx, nd.c, keys, args...))
		if err != nil {
			return nil, err
		}
		reTok[i] = r.Token
		return []int64{r.Code, r.N}, nil
	})
	var (
		acquired  = map[int]int64{}
		held      = map[int]int64{}
		failed    = map[int]error{}
		reentered = map[int]int64{}
		answered  = make([]bool, n)
	)
	classify := func(r reply) {
		answered[r.i] = true
		switch {
		case r.err != nil:
			failed[r.i] = r.err
		case len(r.v) != 2:
			failed[r.i] = fmt.Errorf("unexpected script reply %v", r.v)
		case r.v[0] == 1:
			if c.took(r.i) {
				acquired[r.i] = r.v[1]
			}
		case r.v[0] == 2:
			reentered[r.i] = r.v[1]
		case r.v[0] == 0:
			held[r.i] = r.v[1]
		default:
			failed[r.i] = errLate
		}
	}
	pending, timedOut, ctxErr := collect(ctx, ch, n, nt, func(r reply) bool {
		classify(r)
		if owner != "" {
			// An owner's round waits for every answer (or the timeout): the
			// re-entries it does not use are given back below.
			return false
		}
		return len(acquired) >= s.quorum || len(held)+len(failed) > n-s.quorum
	})
	if timedOut {
		for i := range n {
			if !answered[i] {
				failed[i] = errNodeTimeout
			}
		}
	}
	if pending > 0 { // late answers: the claim keeps or releases what they took
		s.bg.Go(func() {
			for range pending {
				r := <-ch
				switch {
				case r.err != nil || len(r.v) != 2:
				case r.v[0] == 1:
					c.took(r.i)
				case r.v[0] == 2: // a re-entry nobody counted: give it back
					s.releaseNodes(key, reTok[r.i], []int{r.i}, 0)
				}
			}
		})
	}

	if owner != "" && len(reentered) > 0 {
		if l := s.reenter(c, reentered, reTok, start, ttl, onEnd, nt); l != nil {
			return outcome{lease: l}
		}
	}
	if ctxErr != nil {
		return outcome{err: errors.Join(lock.ErrNotAcquired, ctxErr)}
	}
	if len(acquired) < s.quorum {
		_, leader := acquired[s.leaderNode(key)]
		_, rival := held[s.leaderNode(key)]
		switch {
		case len(failed) > 0 && len(acquired)+len(failed) >= s.quorum:
			return outcome{split: len(acquired) > 0, leader: leader, err: s.quorumError("acquire", key, len(acquired), failed)}
		case len(acquired) > 0:
			return outcome{split: true, leader: leader, rival: rival, held: &lock.HeldError{Key: key, TTL: s.holdWait(held)}}
		default:
			return outcome{held: &lock.HeldError{Key: key, TTL: s.holdWait(held)}}
		}
	}
	drift := s.drift(ttl)
	if ttl-time.Since(start)-drift <= 0 {
		return outcome{split: true, err: fmt.Errorf("redlockstore: acquire %q: %w: the round took %s of a %s TTL",
			key, lock.ErrNotAcquired, time.Since(start).Round(time.Microsecond), ttl)}
	}

	var fence uint64
	if s.opts.fenced {
		var err error
		fence, err = s.writeBack(ctx, key, c.tok, acquired, nt)
		if err != nil {
			return outcome{split: !errors.Is(err, ErrNoQuorum) && ctx.Err() == nil, err: err}
		}
		if ttl-time.Since(start)-drift <= 0 {
			return outcome{split: true, err: fmt.Errorf("redlockstore: acquire %q: %w: two rounds took %s of a %s TTL",
				key, lock.ErrNotAcquired, time.Since(start).Round(time.Microsecond), ttl)}
		}
	}
	l := newLease(s, key, c.tok, fence, start.Add(ttl-drift), onEnd)
	c.mu.Lock()
	c.lease = l
	c.mu.Unlock()
	return outcome{lease: l, taken: indexes(acquired)}
}

// reenter settles an owner's round in which nodes re-entered: with a
// majority re-entered under one token it grants a lease on those nodes
// (same token, and the fence the holder got, which the fencing round
// recorded on them) and gives back everything else the round took; without
// one it gives the re-entries back and returns nil.
func (s *Store) reenter(c *claim, reentered map[int]int64, reTok []string, start time.Time, ttl time.Duration,
	onEnd func(), nt time.Duration) *lease {
	byTok := map[string][]int{}
	for i := range reentered {
		byTok[reTok[i]] = append(byTok[reTok[i]], i)
	}
	var winner string
	for tok, idx := range byTok {
		if len(idx) >= s.quorum {
			winner = tok
		}
	}
	for tok, idx := range byTok {
		if tok != winner {
			s.releaseNodes(c.key, tok, idx, nt)
		}
	}
	if winner == "" {
		return nil
	}
	drift := s.drift(ttl)
	if ttl-time.Since(start)-drift <= 0 {
		s.releaseNodes(c.key, winner, byTok[winner], nt)
		return nil
	}
	var fence int64
	for _, i := range byTok[winner] {
		fence = max(fence, reentered[i])
	}
	c.abandon(nt, true) // nodes the round took afresh: the owner holds the key
	l := newLease(s, c.key, winner, uint64(fence), start.Add(ttl-drift), onEnd)
	l.nodes = slices.Sorted(slices.Values(byTok[winner]))
	return l
}

// writeBack is the second round of a fenced acquisition: the fence T is
// the highest counter among the acquired majority. It is written to every
// node (counters only ever grow), and the lease is granted only if a
// majority of nodes answer that our token still holds the key there.
func (s *Store) writeBack(ctx context.Context, key, tok string, acquired map[int]int64, nt time.Duration) (uint64, error) {
	var t int64
	for _, c := range acquired {
		t = max(t, c)
	}
	idx := s.all()
	keys := []string{s.names.Lock(key), s.names.Fence(key), s.names.Owner(key)}
	ch := s.call(idx, func(c context.Context, n *node) ([]int64, error) {
		v, err := redislua.WriteBack.Run(c, n.c, keys, tok, t).Int64()
		return []int64{v}, err
	})
	ok, notOurs := 0, 0
	failed := map[int]error{}
	answered := map[int]bool{}
	_, timedOut, ctxErr := collect(ctx, ch, len(idx), nt, func(r reply) bool {
		answered[r.i] = true
		switch {
		case r.err != nil:
			failed[r.i] = r.err
		case r.v[0] == 1:
			ok++
		default:
			notOurs++
		}
		return ok >= s.quorum || notOurs+len(failed) > len(idx)-s.quorum
	})
	if timedOut {
		for _, i := range idx {
			if !answered[i] {
				failed[i] = errNodeTimeout
			}
		}
	}
	switch {
	case ok >= s.quorum:
		return uint64(t), nil
	case ctxErr != nil:
		return 0, errors.Join(lock.ErrNotAcquired, ctxErr)
	case len(failed) > 0 && ok+len(failed) >= s.quorum:
		return 0, s.quorumError("acquire (fencing round)", key, ok, failed)
	default:
		return 0, fmt.Errorf("redlockstore: acquire %q: %w: the key expired on %d nodes during the fencing round",
			key, lock.ErrNotAcquired, notOurs)
	}
}

// releaseKeys are the release script's keys on every node: the lock, the
// owner hash, and the waiting queue whose first live member a release
// wakes.
func (s *Store) releaseKeys(key string) []string {
	return []string{s.names.Lock(key), s.names.Owner(key), s.names.Queue(key), s.names.QueueExpiry(key)}
}

// wakeGrace is how long a waiting process a release wakes keeps its place
// in a node's queue without trying again, in milliseconds: it tries within
// its backoff, and a process that died while queued is woken once, then
// skipped.
func (s *Store) wakeGrace() int64 { return (4 * s.opts.maxBackoff).Milliseconds() }

// myChannel is where a node announces releases of key to this Store when
// it is first in the node's waiting queue for key.
func (s *Store) myChannel(key string) string { return s.names.Channel(key) + ":" + s.id }

// dequeue removes this Store from key's waiting queue on the nodes in idx,
// waiting up to wait for the answers (the requests go on in the
// background). Waiting matters when the Store may queue for the key again
// soon: a late removal would take its new place.
func (s *Store) dequeue(key string, idx []int, wait time.Duration) {
	if len(idx) == 0 {
		return
	}
	ch := s.call(idx, func(c context.Context, n *node) ([]int64, error) {
		ctx, cancel := context.WithTimeout(c, lock.ReleaseTimeout)
		defer cancel()
		return nil, n.c.Eval(ctx, "redis.call('ZREM', KEYS[1], ARGV[1]); redis.call('HDEL', KEYS[2], ARGV[1]); return 1",
			[]string{s.names.Queue(key), s.names.QueueExpiry(key)}, s.id).Err()
	})
	if wait > 0 {
		_, _, _ = collect(context.Background(), ch, len(idx), wait, func(reply) bool { return false })
	}
}

// releaseNodes runs the release script for tok on the nodes in idx and
// waits up to wait for their answers (0: does not wait).
func (s *Store) releaseNodes(key, tok string, idx []int, wait time.Duration) {
	s.releaseNodesMode(key, tok, idx, wait, s.opts.pubsub.ScriptArg())
}

func (s *Store) releaseNodesMode(key, tok string, idx []int, wait time.Duration, mode string) {
	ch := s.call(idx, func(c context.Context, n *node) ([]int64, error) {
		v, err := redislua.Release.Run(c, n.c, s.releaseKeys(key), tok, s.names.Channel(key), mode, s.wakeGrace()).Int64()
		return []int64{v}, err
	})
	if wait > 0 {
		_, _, _ = collect(context.Background(), ch, len(idx), wait, func(reply) bool { return false })
	}
}

func (s *Store) quorumError(op, key string, got int, failed map[int]error) *QuorumError {
	e := &QuorumError{Op: op, Key: key, Need: s.quorum, Got: got, Failed: map[string]error{}}
	for i, err := range failed {
		e.Failed[s.nodes[i].name] = err
	}
	return e
}

// holdWait is how long until enough held nodes free up for a majority: the
// k-th smallest remaining TTL among them, or -1 if one has no expiry.
func (s *Store) holdWait(held map[int]int64) time.Duration {
	need := s.quorum - (len(s.nodes) - len(held))
	if need <= 0 {
		return 0
	}
	ttls := make([]int64, 0, len(held))
	for _, t := range held {
		ttls = append(ttls, t)
	}
	slices.Sort(ttls)
	if ttls[0] < 0 { // -1 or -2 sort first: some node's key has no expiry
		return -1
	}
	return time.Duration(ttls[need-1]) * time.Millisecond
}

func indexes(m map[int]int64) []int {
	idx := make([]int, 0, len(m))
	for i := range m {
		idx = append(idx, i)
	}
	slices.Sort(idx)
	return idx
}

// TryAcquire implements lock.Locker: one round to all nodes at once (two in
// fenced mode once a majority is taken).
func (s *Store) TryAcquire(ctx context.Context, key string, ttl time.Duration) (lock.Lease, error) {
	if err := s.check(ctx, key, ttl); err != nil {
		return nil, err
	}
	c := s.newClaim(key)
	out := s.attempt(ctx, c, ttl, nil, "", 0)
	if out.lease == nil {
		c.abandon(s.nodeTimeout(ttl), false)
	}
	switch {
	case out.lease != nil:
		return out.lease, nil
	case out.err != nil:
		return nil, out.err
	default:
		return nil, out.held
	}
}

func (s *Store) check(ctx context.Context, key string, ttl time.Duration) error {
	if err := lock.Validate(key, ttl); err != nil {
		return err
	}
	if err := lock.ValidateOwner(lock.Owner(ctx)); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return errors.Join(lock.ErrNotAcquired, err)
	}
	select {
	case <-s.closed:
		return fmt.Errorf("redlockstore: acquire %q: %w", key, lock.ErrClosed)
	default:
		return nil
	}
}

// Acquire implements lock.Locker. Goroutines of this Store waiting for one
// key queue up first come, first served, and only the first competes on the
// nodes; waiting processes queue on the nodes, and a release wakes the
// first of them. It waits for a release message from any node, the
// holder's remaining TTL on the nodes that block a majority, or the recheck
// interval.
// Nodes that cannot be reached are retried with backoff until ctx ends; the
// error then matches ErrNotAcquired, ctx.Err() and, when nodes were down,
// ErrNoQuorum.
func (s *Store) Acquire(ctx context.Context, key string, ttl time.Duration) (lock.Lease, error) {
	if err := s.check(ctx, key, ttl); err != nil {
		return nil, err
	}
	if lock.Owner(ctx) != "" {
		// An owner first tries the key directly: it may hold it already,
		// here or in another process, and must not queue behind itself.
		c := s.newClaim(key)
		if out := s.attempt(ctx, c, ttl, nil, "", 0); out.lease != nil {
			return out.lease, nil
		}
		c.abandon(s.nodeTimeout(ttl), false)
	}
	if err := s.local.Lock(ctx, key); err != nil {
		return nil, errors.Join(lock.ErrNotAcquired, err)
	}
	var once sync.Once
	unlock := func() { once.Do(func() { s.local.Unlock(key) }) }
	l, err := s.acquire(ctx, key, ttl, unlock)
	if err != nil {
		unlock()
		return nil, err
	}
	return l, nil
}

// candidateRounds bounds how many extra rounds a client holding the
// leader node spends completing its majority (after 1, 2, 4, 8 ms) before
// it gives up its nodes.
const candidateRounds = 4

func (s *Store) acquire(ctx context.Context, key string, ttl time.Duration, onEnd func()) (l *lease, err error) {
	var (
		mw        *multiWatch
		backoff   = s.opts.minBackoff
		lastErr   error
		timer     = time.NewTimer(time.Hour)
		c         = s.newClaim(key)
		candidate = 0
		nt        = s.nodeTimeout(ttl)
		member    string // s.id once this waiter queues on the nodes
		place     int64  // its place in the queues: when it began waiting (µs)
		taken     []int  // the nodes of the lease acquired
		joinNow   bool   // try again at once, as a member of the queues
	)
	defer timer.Stop()
	defer func() {
		if mw != nil {
			mw.close()
		}
	}()
	defer func() {
		// Leave the queues: every node when leaving without the key, the
		// nodes not taken (where the place stayed) with it.
		switch {
		case member == "":
		case l == nil:
			s.dequeue(key, s.all(), nt)
		default:
			s.dequeue(key, slices.DeleteFunc(s.all(), func(i int) bool { return slices.Contains(taken, i) }), nt)
		}
	}()
	var woken time.Time // when the last release notice woke us
	sleep := func(d time.Duration, wake <-chan struct{}) error {
		timer.Reset(d)
		defer func() {
			if !timer.Stop() {
				select {
				case <-timer.C:
				default:
				}
			}
		}()
		select {
		case <-wake:
			woken = time.Now()
		case <-timer.C:
		case <-s.closed:
			return fmt.Errorf("redlockstore: acquire %q: %w", key, lock.ErrClosed)
		case <-ctx.Done():
			return errors.Join(lock.ErrNotAcquired, ctx.Err(), lastErr)
		}
		return nil
	}
	for {
		out := s.attempt(ctx, c, ttl, onEnd, member, place)
		if out.lease != nil {
			taken = out.taken
			if !woken.IsZero() {
				observe.Record(ctx, s.opts.observer, observe.Event{
					Op: observe.LockHandOff, Driver: driverName, Key: key, Outcome: observe.Notified,
					Fence: out.lease.Fence(), Duration: time.Since(woken),
				})
			}
			return out.lease, nil
		}
		woken = time.Time{}
		if out.err != nil && ctx.Err() == nil {
			lastErr = out.err // kept for the final error when ctx ends
		}
		if ctx.Err() != nil {
			c.abandon(nt, false)
			return nil, errors.Join(lock.ErrNotAcquired, ctx.Err(), lastErr)
		}
		if mw == nil {
			// Subscribe on every node — to the key's release channel and to
			// this Store's own — and try again at once as a member of the
			// key's waiting queue: a release between the first attempt and
			// the subscription is not missed, and from now on a release
			// wakes only the first waiting process.
			mw = s.watchChannels(s.names.Channel(key), s.myChannel(key))
			member, place = s.id, time.Now().UnixMicro()
			if out.err == nil && !out.split {
				continue
			}
			joinNow = out.err == nil // after settling the split below
		}
		if out.split && out.leader && candidate < candidateRounds {
			// A split vote, and we hold the leader node: the others see that
			// they do not and give their nodes up, which wakes us. Keep ours
			// and take the rest.
			if err := sleep(time.Millisecond<<candidate, nil); err != nil {
				c.abandon(nt, false)
				return nil, err
			}
			candidate++
			continue
		}
		// Split-vote losers whose rival holds the leader node give their
		// nodes back quietly: the rival takes them, and announces its own
		// release later. Everyone else announces the release, or nobody
		// would be woken.
		c.abandon(nt, out.split && out.rival && out.err == nil)
		c, candidate = s.newClaim(key), 0
		var (
			wait time.Duration
			wake = mw.wake
		)
		switch {
		case out.err != nil || (out.split && !out.rival):
			// A failed round, a candidate that could not complete, or a
			// split nobody settles (the leader node free): back off with
			// full jitter, deaf to releases, so that competitors woken by
			// the same message do not collide again.
			wait = rand.N(backoff + 1)
			backoff = min(2*backoff, s.opts.maxBackoff)
			wake = nil
		case out.split:
			// Someone else holds the leader node and will win: wait for it,
			// and spread the next attempts of the woken.
			wait = s.opts.recheck
			backoff = min(2*backoff, s.opts.maxBackoff)
		default:
			wait = s.opts.recheck
			if t := out.held.TTL; t >= 0 && t < wait {
				wait = t + time.Millisecond
			}
		}
		if joinNow {
			// A split vote on the first attempt, which was not queued: this
			// waiter is in no queue yet, so no release would wake it.
			wait, joinNow = 0, false
		}
		if err := sleep(wait, wake); err != nil {
			return nil, err
		}
		if wake != nil && backoff > s.opts.minBackoff {
			// Contention since this waiter last held the key: the other
			// processes woken by the same release compete too. Spread the
			// attempts over the backoff window, deaf to further messages.
			if err := sleep(rand.N(backoff+1), nil); err != nil {
				return nil, err
			}
		}
	}
}

// multiWatch is a waiter's subscription to a key's release channel on
// every node: a message from any of them wakes it.
type multiWatch struct {
	wake chan struct{}
	stop chan struct{}
}

// watchChannels subscribes to channels on every node and returns once a
// majority confirmed (or could not), or after the node timeout for the
// slow ones. A message on any of them, from any node, wakes the waiter.
func (s *Store) watchChannels(channels ...string) *multiWatch {
	mw := &multiWatch{wake: make(chan struct{}, 1), stop: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{}, len(s.nodes)*len(channels))
	for _, n := range s.nodes {
		for _, channel := range channels {
			s.watchOne(ctx, mw, n, channel, ready)
		}
	}
	s.bg.Go(func() {
		<-mw.stop
		cancel()
	})
	t := time.NewTimer(s.nodeTimeout(time.Second))
	defer t.Stop()
	for range s.quorum * len(channels) {
		select {
		case <-ready:
		case <-t.C:
			return mw
		}
	}
	return mw
}

// watchOne forwards channel's messages on n to mw until mw stops.
func (s *Store) watchOne(ctx context.Context, mw *multiWatch, n *node, channel string, ready chan<- struct{}) {
	s.bg.Go(func() {
		w, err := n.sub.Watch(ctx, channel)
		ready <- struct{}{}
		if err != nil {
			return
		}
		defer n.sub.Unwatch(w)
		for {
			select {
			case <-w.Wake():
				select {
				case mw.wake <- struct{}{}:
				default:
				}
			case <-mw.stop:
				return
			}
		}
	})
}

func (mw *multiWatch) close() { close(mw.stop) }

const driverName = "redlock"

// DriverName implements observe.Source: "redlock".
func (s *Store) DriverName() string { return driverName }

// Observer implements observe.Source: the WithObserver option.
func (s *Store) Observer() observe.Observer { return s.opts.observer }

var (
	_ lock.Locker = (*Store)(nil)
	_ lock.Lease  = (*lease)(nil)
)
