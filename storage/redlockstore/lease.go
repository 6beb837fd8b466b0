package redlockstore

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/lock/lockdriver"
	"github.com/oncekit/oncekit/storage/internal/rediskit"
)

// lease is one acquisition on a majority of the nodes. Its lifecycle is
// lockdriver.Control's; this type adds the rounds that touch the nodes.
type lease struct {
	lockdriver.Control
	s     *Store
	nodes []int // an owner's re-entry: the nodes it counted; nil: all

	// The hold's fences (fenced mode): base is the fence T of the
	// acquisition (fenceOf); the hold's leases take the fences T + 0, 1,
	// …, T + rediskit.HoldFences − 1, used being this lease's (0
	// unfenced). Releases leave every node the last of them (floor).
	base, used uint64
	took       time.Time // when the Store learnt it took the key from the nodes
	votes      *votes    // the round's votes that took the hold (nil for a re-entry): ended with the hold
	hot        bool      // taken by a non-owner right after this Store let the key go: kept on Release

	// passed is set when the Store kept the lease's hold (kept.go): the
	// token on the nodes is no longer this lease's to refresh or release.
	// (A Refresh in flight when the lease was released would otherwise
	// release the hold its successor takes.)
	passed atomic.Bool
}

// newLease returns a held lease valid until deadline (the start of its
// round + TTL − drift), the used-th of a hold with fence base (0
// unfenced).
func (s *Store) newLease(key, tok string, base, used uint64, deadline time.Time, onEnd func(), nodes []int) *lease {
	l := &lease{s: s, nodes: nodes, base: base, used: used}
	var fence uint64
	if s.redlock.fenced {
		fence = base + used
	}
	cfg := lockdriver.Config{Driver: "redlockstore", Key: key, Token: tok, Fence: fence, Deadline: deadline, Store: l}
	if onEnd != nil {
		cfg.OnEnd = func(lockdriver.State) { onEnd() }
	}
	l.Init(cfg)
	return l
}

// floor is the fence every node the hold took keeps once it is released:
// the last of the hold's fences (0 unfenced). A node issues the next hold
// a fence above it (see fenceOf).
func (l *lease) floor() uint64 {
	if l.base == 0 {
		return 0
	}
	return l.base + rediskit.HoldFences - 1
}

// targets are the nodes the lease's rounds go to.
func (l *lease) targets() []int {
	if l.nodes != nil {
		return l.nodes
	}
	return l.s.all()
}

// StoreRefresh implements lockdriver.Store: it extends the lease on every
// node at once and succeeds when a majority extended it in time; the new
// validity is TTL − drift from the start of the round.
func (l *lease) StoreRefresh(ctx context.Context, ttl time.Duration) (time.Time, error) {
	s := l.s
	if l.passed.Load() {
		return time.Time{}, fmt.Errorf("redlockstore: refresh %q: %w", l.Key(), lock.ErrLockLost)
	}
	start := time.Now()
	v := s.poll(ctx, l.targets(), s.nodeTimeout(ttl), false, func(ctx context.Context, n *node) (bool, error) {
		return s.base.Refresh(ctx, n.c, l.Key(), l.Token(), ttl)
	})
	if err := s.verdict("refresh", l.Key(), v, lock.ErrLockLost); err != nil {
		return time.Time{}, err
	}
	deadline := start.Add(ttl - s.drift(ttl))
	if time.Until(deadline) <= 0 {
		return time.Time{}, fmt.Errorf("redlockstore: refresh %q: the round outlasted the TTL %s", l.Key(), ttl)
	}
	return deadline, nil
}

// StoreRelease implements lockdriver.Store: it keeps a hot key's hold for
// the Store's next Acquire (WithLinger), or deletes the lease on every
// node and announces it on each, and returns once the outcome is decided:
// nil when a majority let it go, lock.ErrLockLost when a majority no
// longer held it, a *QuorumError when too many nodes were unreachable (the
// keys left on them expire with their TTL; Release may be retried).
func (l *lease) StoreRelease(ctx context.Context) error {
	s := l.s
	if l.passed.Load() || s.keep(l) {
		return nil // kept now, or released already: its hold went on
	}
	nt := s.nodeTimeout(max(l.Remaining(), time.Millisecond))
	// The short release script only for the hold's first lease: a hold
	// kept for later leases is one that other processes wait for, whose
	// key carries their flag by then.
	call := s.releaseCall(l.votes, l.Key(), l.Token(), l.floor(), l.used == 0, nt/2)
	ended := func() {}
	if l.used > 0 {
		// The last lease of a hold the Store kept: the hold ends here, and
		// late answers for its token give their nodes back (votes.took).
		// (A hold that was never kept ends with its first lease, which
		// took tells from its state.)
		ended = l.votes.end()
	}
	v := s.poll(ctx, l.targets(), nt, false, func(ctx context.Context, n *node) (bool, error) {
		code, err := call(ctx, n)
		return code.Ours(), err
	})
	ended()
	err := s.verdict("release", l.Key(), v, lock.ErrLockLost)
	if err == nil {
		s.recent.LetGo(l.Key())
	}
	return err
}

var _ lockdriver.Store = (*lease)(nil)
