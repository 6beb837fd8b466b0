package redlockstore

import (
	"context"
	"fmt"
	"time"
)

// answer is one node's reply in a round.
type answer[T any] struct {
	node int
	v    T
	err  error
}

// round is one request sent to several nodes at once, each on its own
// goroutine (tracked by the Store's background group, so nothing outlives
// Close). Requests use the clients' own timeouts; the round stops waiting
// on its own schedule.
type round[T any] struct {
	s        *Store
	nodes    []int
	ch       chan answer[T]
	pending  int
	answered map[int]bool
	failed   map[int]error // by node: errors and, after a timeout, errNodeTimeout
}

// newRound sends call to the nodes in idx.
func newRound[T any](s *Store, idx []int, call func(ctx context.Context, n *node) (T, error)) *round[T] {
	r := &round[T]{s: s, nodes: idx, ch: make(chan answer[T], len(idx)), pending: len(idx),
		answered: map[int]bool{}, failed: map[int]error{}}
	for _, i := range idx {
		s.nodes[i].sending()
		s.base.BG.Go(func() {
			v, err := call(context.Background(), s.nodes[i])
			s.nodes[i].answered(err)
			r.ch <- answer[T]{node: i, v: v, err: err}
		})
	}
	return r
}

// collect reads answers until on (which sees every answer, errors
// included, after they are recorded in r.failed) reports the outcome
// decided, every node answered, timeout passes, or ctx ends (its error is
// returned). Nodes still silent at the timeout count as failed.
func (r *round[T]) collect(ctx context.Context, timeout time.Duration, on func(answer[T]) bool) error {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for r.pending > 0 {
		select {
		case a := <-r.ch:
			r.pending--
			r.answered[a.node] = true
			if a.err != nil {
				r.failed[a.node] = a.err
			}
			if on(a) {
				r.failSuspects()
				return nil
			}
		case <-t.C:
			for _, i := range r.nodes {
				if !r.answered[i] {
					r.failed[i] = r.s.nodes[i].timeoutErr()
					r.s.nodes[i].suspect()
				}
			}
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// failSuspects counts the suspect nodes that have not answered as failed,
// with their last known failure, when a round stops without them.
func (r *round[T]) failSuspects() {
	for _, i := range r.nodes {
		if n := r.s.nodes[i]; !r.answered[i] && r.failed[i] == nil && n.isSuspect() {
			r.failed[i] = n.lastFailure()
		}
	}
}

// hopeful is how many nodes have not answered yet and are not suspect (their
// last request failed or timed out): the answers a round can still count on
// before its timeout. A round whose outcome those answers cannot change
// stops waiting; a suspect node that answers after all is handled by rest.
func (r *round[T]) hopeful() int {
	n := 0
	for _, i := range r.nodes {
		if !r.answered[i] && !r.s.nodes[i].isSuspect() {
			n++
		}
	}
	return n
}

// settle waits up to timeout for the answers of clean-up rounds (giving
// nodes back, leaving queues): until every node it can count on answered.
// A paused or partitioned node then costs them nothing; its request goes
// on in the background.
func (r *round[T]) settle(timeout time.Duration) {
	if timeout <= 0 || r.hopeful() == 0 {
		return
	}
	_ = r.collect(context.Background(), timeout, func(answer[T]) bool { return r.hopeful() == 0 })
}

// rest passes the answers collect did not read to late, in the
// background.
func (r *round[T]) rest(late func(answer[T])) {
	if r.pending == 0 {
		return
	}
	n := r.pending
	r.pending = 0
	r.s.base.BG.Go(func() {
		for range n {
			late(<-r.ch)
		}
	})
}

// vote is the outcome of a round whose nodes answer yes (the token holds
// the key there, and the request took effect) or no (another token, or
// none).
type vote struct {
	yes, no int
	polled  int // nodes asked: the others never held the key for this round's token
	failed  map[int]error
	ctxErr  error
}

// poll runs a yes/no round on the nodes in idx. It returns once a majority
// said yes or can no longer say it, or — with all — once every node
// answered (or the timeout passed).
func (s *Store) poll(ctx context.Context, idx []int, timeout time.Duration, all bool, call func(ctx context.Context, n *node) (bool, error)) vote {
	r := newRound(s, idx, call)
	v := vote{polled: len(idx)}
	v.ctxErr = r.collect(ctx, timeout, func(a answer[bool]) bool {
		switch {
		case a.err != nil:
		case a.v:
			v.yes++
		default:
			v.no++
		}
		if all {
			return false
		}
		return v.yes >= s.quorum || v.no+len(r.failed) > len(idx)-s.quorum || v.yes+r.hopeful() < s.quorum
	})
	v.failed = r.failed
	return v
}

// verdict turns a vote on a held key into the error of op: nil with a
// majority of yes, lost (lock.ErrLockLost or lock.ErrLockLost) when a
// majority no longer held it, ctx's error, or a *QuorumError. Nodes the
// round did not ask (a re-entry asks only the nodes its hold counted)
// count as no: they never held the key for it.
func (s *Store) verdict(op, key string, v vote, lost error) error {
	switch {
	case v.yes >= s.quorum:
		return nil
	case v.ctxErr != nil:
		return fmt.Errorf("redlockstore: %s %q: %w", op, key, v.ctxErr)
	case v.no+len(s.nodes)-v.polled > len(s.nodes)-s.quorum:
		return fmt.Errorf("redlockstore: %s %q: %w", op, key, lost)
	default:
		return s.quorumError(op, key, v.yes, v.failed)
	}
}
