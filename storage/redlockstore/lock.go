package redlockstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/lock/lockdriver"
	"github.com/oncekit/oncekit/storage/internal/rediskit"
	"github.com/oncekit/oncekit/storage/internal/token"
)

// votes is one token's hold on the nodes, across the attempts that use it.
// It knows every node the token took, including ones whose answer came
// after their round had ended, so that whatever happens to the attempts
// nothing is left behind: given up, it releases all of them, and so does a
// late answer after it was given up or its lease ended.
type votes struct {
	s   *Store
	key string
	tok string

	mu      sync.Mutex
	nodes   map[int]bool
	gaveUp  bool
	lease   *lease
	ending  bool  // the hold's last release is under way (end)
	pending []int // nodes late answers took meanwhile, released after it

	// plain lets an unfenced first attempt take free nodes with a plain
	// SET NX (sendAcquire): a blocking Acquire's, not TryAcquire's, for
	// which a held key must cost one request per node.
	plain bool

	// per is what is known of each node (by index) for the hold's
	// release: see release.go. Made by the first round.
	per []perNode
	// landed, when not nil, is closed when the next answer is recorded
	// (a release waits for one: votes.await).
	landed chan struct{}
}

func (s *Store) newVotes(key string) *votes {
	return &votes{s: s, key: key, tok: token.New(), nodes: map[int]bool{}}
}

// took records that node i holds the token; it reports false (and releases
// the node) when the votes are no longer wanted: given up, or their lease
// ended and its hold did not go on.
//
// A hold the Store kept (kept.go) goes on under the same token in later
// leases, and a late answer to one of this token's rounds — an earlier
// round of the same wait, whose node the winning round counted again — may
// be a node of that hold: releasing it would take the hold below a majority
// while one of its leases is live. Such a node is recorded; the hold's
// last release asks every node. A late answer that comes while that
// release is under way (end) is released once it is over: released before,
// the node would answer that release "not ours", and a hold released in
// full would be reported lost.
func (v *votes) took(i int, r rediskit.AcquireReply) bool {
	t := take{clock: rediskit.ReadClock(r.Clock), plain: r.Plain}
	v.mu.Lock()
	p := v.node(i)
	p.take = t
	if p.awaiting > 0 {
		// A release is waiting for this node's answers: it releases the
		// node itself (release.go).
		p.caught = true
		v.mu.Unlock()
		return false
	}
	if v.ending {
		v.pending = append(v.pending, i)
		v.mu.Unlock()
		return false
	}
	over := v.gaveUp || (v.lease != nil && v.lease.State() != lockdriver.Live && !v.lease.passed.Load())
	floor := v.floor()
	if !over {
		v.nodes[i] = true
	}
	v.mu.Unlock()
	if over {
		v.s.releaseNodes(v.key, v.tok, []int{i}, 0, false, floor)
	}
	return !over
}

// floor is the fence a node the votes' token took must keep when it is
// released: the last of the granted hold's fences (0 unfenced, or before a hold was
// granted). A node that answers late keeps it too, so that every node the
// hold took keeps it: a later majority meets them also when some lost
// their data. v.mu is held.
func (v *votes) floor() uint64 {
	if v.lease == nil {
		return 0
	}
	return v.lease.floor()
}

// end marks the votes' hold as being released on the nodes: the votes are
// no longer wanted. It returns the function to call once that release is
// over, which releases the nodes late answers took meanwhile; after it, a
// late answer's node is released at once.
func (v *votes) end() (ended func()) {
	if v == nil {
		return func() {}
	}
	v.mu.Lock()
	v.gaveUp, v.ending = true, true
	v.nodes = map[int]bool{}
	floor := v.floor()
	v.mu.Unlock()
	return func() {
		v.mu.Lock()
		v.ending = false
		idx := v.pending
		v.pending = nil
		v.mu.Unlock()
		if len(idx) > 0 {
			v.s.releaseNodes(v.key, v.tok, idx, 0, false, floor)
		}
	}
}

// giveUp releases every node the token took, waiting up to wait. Quiet
// publishes no release message: a split-vote loser giving its nodes back
// to the leader-node holder should not wake every other waiter.
func (v *votes) giveUp(wait time.Duration, quiet bool) {
	v.mu.Lock()
	v.gaveUp = true
	idx := indexes(v.nodes)
	v.nodes = map[int]bool{}
	floor := v.floor()
	v.mu.Unlock()
	if len(idx) > 0 {
		v.s.releaseNodes(v.key, v.tok, idx, wait, quiet, floor)
	}
}

// outcome of one acquisition attempt.
type outcome struct {
	lease    *lease
	busy     *lock.BusyError // the key is held: wait for it
	split    bool            // we took some nodes, not a majority
	leader   bool            // ... including the key's leader node
	rival    bool            // another token holds the leader node (or it is kept for a woken waiter)
	rivalTTL time.Duration   // ... for this long (its PTTL; -1: no expiry)
	err      error           // a *QuorumError, a ctx error, or a failed fencing round
	taken    []int           // the nodes the round took (a lease's majority)
	failed   bool            // some node failed to answer (or was not waited for)
}

// acquireRound is what one acquisition round's nodes answered.
type acquireRound struct {
	start     time.Time
	taken     map[int]int64 // the nodes taken: their fences
	clocks    map[int]int64 // ... and their clocks in µs when they issued them
	busy      map[int]int64 // the nodes held by another token: their PTTLs
	busyQ     int           // ... of which the key's queue nodes (queueNode)
	crowded   int           // ... of which the nodes where processes wait in the key's queue
	asked     int           // how many nodes the round asked
	reentered map[int]int64 // the nodes an owner re-entered: its fence there
	reTok     map[int]string
	failed    map[int]error
	ctxErr    error
}

// sendAcquire runs the acquire script on every node at once for the votes'
// token: SET NX PX with the node's next fence, or a renewal
// where the token already holds the key. A waiter (queued) joins the key's
// waiting queue on the nodes where the key is held, at place (the same on
// every node, so that they order waiters alike). only, when not nil, is
// the nodes to ask instead of all of them.
func (s *Store) sendAcquire(ctx context.Context, v *votes, ttl time.Duration, queued bool, place int64, only []int) *acquireRound {
	owner := lock.Owner(ctx)
	ar := &acquireRound{start: time.Now(), taken: map[int]int64{}, clocks: map[int]int64{}, busy: map[int]int64{}, reentered: map[int]int64{}, reTok: map[int]string{}}
	nt := s.nodeTimeout(ttl)
	deadline := ar.start.Add(nt)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	args := rediskit.AcquireArgs{Key: v.key, Token: v.tok, TTL: ttl, Deadline: deadline,
		Unfenced: !s.redlock.fenced, Owner: owner, Queued: queued, Place: place}
	// Unfenced, a first attempt at a key this Store has not seen contended
	// lately is a plain SET NX on each node (below).
	plain := v.plain && args.Unfenced && owner == "" && !queued && !s.recent.Hot(v.key) && !s.crowded.Marked(v.key)
	idx := only
	if idx == nil {
		idx = s.all()
	}
	ar.asked = len(idx)
	leader := s.leaderNode(v.key)
	leaderIn := slices.Contains(idx, leader) // asked, not answered yet
	v.sending(idx)
	r := newRound(s, idx, func(ctx context.Context, n *node) (rediskit.AcquireReply, error) {
		if sn, ok := n.c.(rediskit.SetNXer); ok && plain {
			// As redsync's: a key that exists in any form goes on to the
			// script (a second request to the node, which is why a key seen
			// contended skips this). A take that lands after the round
			// gave up is given back when its answer comes, or expires:
			// see votes.took.
			took, err := s.base.TakeNew(ctx, sn, v.key, v.tok, ttl, nil)
			switch {
			case err != nil:
				return rediskit.AcquireReply{}, err
			case took:
				return rediskit.AcquireReply{Code: rediskit.AcquireTaken, Plain: true}, nil
			}
		}
		if queued && !s.queueNode(v.key, n.index) {
			a := args
			a.Queued = false // not a queue node: the short script
			return s.base.Acquire(ctx, n.c, a, nil)
		}
		return s.base.Acquire(ctx, n.c, args, nil)
	})
	ar.ctxErr = r.collect(ctx, nt, func(a answer[rediskit.AcquireReply]) bool {
		switch {
		case a.err != nil:
		case a.v.Code == rediskit.AcquireTaken:
			if v.took(a.node, a.v) {
				ar.taken[a.node], ar.clocks[a.node] = a.v.N, a.v.Clock
			}
		case a.v.Code == rediskit.AcquireReentered:
			ar.reentered[a.node], ar.reTok[a.node] = a.v.N, a.v.Token
		case a.v.Code == rediskit.AcquireBusy:
			ar.busy[a.node] = a.v.N
			if s.queueNode(v.key, a.node) {
				ar.busyQ++
				if a.v.Crowded {
					ar.crowded++
				}
			}
		default:
			r.failed[a.node] = errLate
		}
		v.answered(a.node, a.err != nil)
		if a.node == leader {
			leaderIn = false
		}
		// An owner's round waits for every answer (or the timeout): the
		// re-entries it does not use are given back. A round that can no
		// longer reach a majority still waits for the key's leader node
		// (unless it is suspect): its holder settles a split vote, and
		// one whose take there lands after the round would give it back.
		return owner == "" && (len(ar.taken) >= s.quorum ||
			(len(ar.busy)+len(r.failed) > len(s.nodes)-s.quorum || len(ar.taken)+r.hopeful() < s.quorum) &&
				(!leaderIn || s.nodes[leader].isSuspect()))
	})
	ar.failed = r.failed
	r.rest(func(a answer[rediskit.AcquireReply]) { // late answers: keep or give back what they took
		switch {
		case a.err != nil:
		case a.v.Code == rediskit.AcquireTaken:
			v.took(a.node, a.v)
		case a.v.Code == rediskit.AcquireReentered: // a re-entry nobody counted
			s.releaseNodes(v.key, a.v.Token, []int{a.node}, 0, false, 0)
		}
		v.answered(a.node, a.err != nil)
	})
	return ar
}

// attempt makes one Redlock acquisition for the votes' token: one round,
// granted with a majority and validity left (and, fenced, nodes whose
// clocks agree with the fence: see fenceOf). On failure the caller
// decides whether to keep the votes for another round or give them up.
// only, when not nil, is the nodes to ask (a majority: a waiter that
// expects the key held asks the key's queue nodes only).
func (s *Store) attempt(ctx context.Context, v *votes, ttl time.Duration, onEnd func(), queued bool, place int64, only []int) outcome {
	ar := s.sendAcquire(ctx, v, ttl, queued, place, only)
	if lock.Owner(ctx) != "" && len(ar.reentered) > 0 {
		if l := s.reenter(v, ar, ttl, onEnd); l != nil {
			return outcome{lease: l}
		}
	}
	if ar.ctxErr != nil {
		return outcome{err: lockdriver.NotAcquired(ctx)}
	}
	if len(ar.taken) < s.quorum {
		if ar.crowded > 0 && 2*ar.crowded > ar.busyQ && !s.recent.Hot(v.key) {
			// Processes queued on most of the key's queue nodes that
			// answered (a round ends with the first majority of answers,
			// which may include one queue node), for a key this Store did
			// not just let go: it is taken in turns between processes.
			s.crowded.Mark(v.key)
		}
		leader := s.leaderNode(v.key)
		_, isLeader := ar.taken[leader]
		pttl, rival := ar.busy[leader]
		busy := &lock.BusyError{Key: v.key, TTL: s.holdWait(ar.busy, ar.asked)}
		switch {
		case len(ar.failed) > 0 && len(ar.taken)+len(ar.failed) >= s.quorum:
			return outcome{split: len(ar.taken) > 0, leader: isLeader, err: s.quorumError("acquire", v.key, len(ar.taken), ar.failed)}
		case len(ar.taken) > 0:
			return outcome{split: true, leader: isLeader, rival: rival, rivalTTL: ttlOf(pttl), busy: busy}
		default:
			return outcome{busy: busy, failed: len(ar.failed) > 0}
		}
	}
	return s.grant(ctx, v, ar, ttl, onEnd)
}

// grant turns a majority into a lease valid for what is left of the TTL
// after the round and the drift allowance, with the fence of fenceOf
// (fenced mode).
func (s *Store) grant(ctx context.Context, v *votes, ar *acquireRound, ttl time.Duration, onEnd func()) outcome {
	if ttl-time.Since(ar.start)-s.drift(ttl) <= 0 {
		return outcome{split: true, err: fmt.Errorf("redlockstore: acquire %q: %w: the round took %s of a %s TTL",
			v.key, lock.ErrNotAcquired, time.Since(ar.start).Round(time.Microsecond), ttl)}
	}
	var fence uint64
	if s.redlock.fenced {
		var err error
		if fence, err = s.fenceOf("acquire", v.key, ar.taken, ar.clocks, ttl); err != nil {
			return outcome{err: err}
		}
	}
	l := s.newLease(v.key, v.tok, fence, 0, ar.start.Add(ttl-s.drift(ttl)), onEnd, nil)
	l.votes = v
	l.took = time.Now() // WithMaxLocalHold counts from here
	v.mu.Lock()
	v.lease = l
	v.mu.Unlock()
	return outcome{lease: l, taken: indexes(ar.taken)}
}

// reenter settles an owner's round in which nodes re-entered: with a
// majority re-entered under one token it grants a lease on those nodes
// (same token, and the fence the holder got, which the fencing round
// recorded on them) and gives back everything else the round took; without
// one it gives the re-entries back and returns nil.
func (s *Store) reenter(v *votes, ar *acquireRound, ttl time.Duration, onEnd func()) *lease {
	nt := s.nodeTimeout(ttl)
	byTok := map[string][]int{}
	for _, i := range indexes(ar.reentered) {
		byTok[ar.reTok[i]] = append(byTok[ar.reTok[i]], i)
	}
	var winner string
	for tok, idx := range byTok {
		if len(idx) >= s.quorum {
			winner = tok
		}
	}
	for tok, idx := range byTok {
		if tok != winner {
			s.releaseNodes(v.key, tok, idx, nt, false, 0)
		}
	}
	if winner == "" {
		return nil
	}
	if ttl-time.Since(ar.start)-s.drift(ttl) <= 0 {
		s.releaseNodes(v.key, winner, byTok[winner], nt, false, 0)
		return nil
	}
	var fence int64
	for _, i := range byTok[winner] {
		fence = max(fence, ar.reentered[i])
	}
	v.giveUp(nt, true) // nodes the round took afresh: the owner holds the key
	return s.newLease(v.key, winner, uint64(fence), 0, ar.start.Add(ttl-s.drift(ttl)), onEnd, byTok[winner])
}

// fenceOf is the fence of a hold (or claim) that took the nodes in taken,
// which issued those fences at those clocks (µs): the highest of them, T.
//
// Why T is above every earlier hold's fence: an earlier hold A and this
// one B took majorities that share a node n, where A's key was gone when
// B took it. Either A released it, and A's release left n a tombstone
// with A's fence T(A) (releases carry the hold's fence to every node), so
// n issued B more than T(A); or A's key expired on n, a TTL after n issued
// A its fence by n's clock, and n issued B at least its clock, which had
// moved on by a TTL. That is above T(A) if T(A) was less than a TTL ahead
// of n's clock when n issued A its fence — which A checked: a hold is
// granted only if T is at most half its TTL ahead of every taken node's
// clock. So fences are unique and ordered as the holds were, as long as
// no node's clock steps back; nodes whose clocks disagree by more than
// half the TTL are refused (ErrClockSkew) rather than trusted.
func (s *Store) fenceOf(op, key string, taken, clocks map[int]int64, ttl time.Duration) (uint64, error) {
	var t int64
	for _, f := range taken {
		t = max(t, f)
	}
	for i := range taken {
		if ahead := time.Duration(t-clocks[i]) * time.Microsecond; ahead > ttl/2 {
			return 0, &ClockSkewError{Op: op, Key: key, Node: s.nodes[i].name, Ahead: ahead, TTL: ttl}
		}
	}
	return uint64(t), nil
}

// TryAcquire implements lock.Locker: one round to all nodes at once (two in
// fenced mode once a majority is taken). When simultaneous attempts split
// the nodes with no majority, the one holding the key's leader node asks
// the rest again (after 1, 2, 4 and 8 ms at most) while the others give
// theirs back: one of them gets the key, not none.
func (s *Store) TryAcquire(ctx context.Context, key string, ttl time.Duration) (lock.Lease, error) {
	if err := s.check(ctx, key, ttl); err != nil {
		return nil, err
	}
	hot := lock.Owner(ctx) == "" && s.recent.Hot(key)
	if lock.Owner(ctx) == "" {
		if l := s.takeKept(key, ttl); l != nil {
			return l, nil
		}
	}
	v := s.newVotes(key)
	out := s.attempt(ctx, v, ttl, nil, false, 0, nil)
	// A split vote between simultaneous attempts, none of them a majority:
	// the one holding the key's leader node keeps its nodes and asks again
	// while the others hand theirs back, so that one of them gets the key.
	for c := 0; out.lease == nil && out.split && out.leader && out.err == nil && c < candidateRounds; c++ {
		t := time.NewTimer(time.Millisecond << c)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
		if ctx.Err() != nil {
			break
		}
		out = s.attempt(ctx, v, ttl, nil, false, 0, nil)
	}
	if out.lease == nil {
		// A loser whose rival holds the leader node wakes no waiter.
		v.giveUp(s.nodeTimeout(ttl), out.split && out.rival && out.err == nil)
	}
	switch {
	case out.lease != nil:
		out.lease.hot = hot
		return out.lease.Lease(), nil
	case out.err != nil:
		return nil, out.err
	default:
		return nil, out.busy
	}
}

func (s *Store) check(ctx context.Context, key string, ttl time.Duration) error {
	if _, err := lockdriver.CheckAcquire(ctx, key, ttl); err != nil {
		return err
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
	hot := lock.Owner(ctx) == "" && s.recent.Hot(key)
	if lock.Owner(ctx) == "" {
		if l := s.takeKept(key, ttl); l != nil {
			return l, nil
		}
	} else {
		// An owner first tries the key directly: it may hold it already,
		// here or in another process, and must not queue behind itself.
		v := s.newVotes(key)
		if out := s.attempt(ctx, v, ttl, nil, false, 0, nil); out.lease != nil {
			return out.lease.Lease(), nil
		}
		v.giveUp(s.nodeTimeout(ttl), false)
	}
	if err := s.local.Lock(ctx, key); err != nil {
		return nil, errors.Join(lock.ErrNotAcquired, err)
	}
	var once sync.Once
	unlock := func() { once.Do(func() { s.local.Unlock(key) }) }
	w := &waiting{s: s, key: key, ttl: ttl, onEnd: unlock, backoff: s.base.MinBackoff, votes: s.newVotes(key)}
	w.votes.plain = true
	early := s.crowded.Marked(key)
	if early {
		w.held = true // taken in turns: most likely held now
		// Processes were queued for the key a moment ago, on a majority
		// of the nodes: it is taken in turns. Queue from the first
		// attempt, one round instead of two per turn.
		w.subscribe()
	}
	l, err := w.run(ctx)
	if early && w.waited {
		s.crowded.Mark(key) // still taken in turns: no first attempt saw it
	}
	if err != nil {
		unlock()
		return nil, err
	}
	l.hot = hot
	return l.Lease(), nil
}

// leaveQueues removes this Store from key's waiting queue on the nodes in
// idx, waiting up to wait for the answers (the requests go on in the
// background). Waiting matters when the Store may queue for the key again
// soon: a late removal would take its new place.
func (s *Store) leaveQueues(key string, idx []int, wait time.Duration) {
	if len(idx) == 0 {
		return
	}
	r := newRound(s, idx, func(ctx context.Context, n *node) (struct{}, error) {
		ctx, cancel := context.WithTimeout(ctx, lockdriver.ReleaseTimeout)
		defer cancel()
		return struct{}{}, s.base.LeaveQueue(ctx, n.c, key)
	})
	r.settle(wait)
}

// releaseNodes runs the release script for tok on the nodes in idx and
// waits up to wait for their answers (0: does not wait). The key keeps
// the fence floor on each node (a hold's T: see fenceOf; 0 for nodes
// taken by no granted hold).
func (s *Store) releaseNodes(key, tok string, idx []int, wait time.Duration, quiet bool, floor uint64) {
	r := newRound(s, idx, func(ctx context.Context, n *node) (rediskit.ReleaseCode, error) {
		return s.base.Release(ctx, n.c, key, tok, quiet, floor, 0, false, 0)
	})
	r.settle(wait)
}
