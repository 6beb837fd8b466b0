package redlockstore

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/internal/redislua"
)

type leaseState int

const (
	held leaseState = iota
	released
	lost
)

type lease struct {
	s     *Store
	key   string
	token string
	fence uint64
	done  chan struct{}
	onEnd func() // frees the Store's local queue slot, or nil
	nodes []int  // an owner's re-entry: the nodes it counted; nil: all

	mu       sync.Mutex
	state    leaseState
	deadline time.Time // end of validity: start of the last round + TTL − drift
	timer    *time.Timer
}

func newLease(s *Store, key, tok string, fence uint64, deadline time.Time, onEnd func()) *lease {
	l := &lease{s: s, key: key, token: tok, fence: fence, done: make(chan struct{}), onEnd: onEnd, deadline: deadline}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.timer = time.AfterFunc(time.Until(deadline), l.expire)
	return l
}

func (l *lease) Key() string           { return l.key }
func (l *lease) Token() string         { return l.token }
func (l *lease) Fence() uint64         { return l.fence }
func (l *lease) Done() <-chan struct{} { return l.done }

func (l *lease) finished() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.state != held
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
	l.finish(lost)
}

func (l *lease) finish(st leaseState) {
	l.mu.Lock()
	if l.state != held {
		l.mu.Unlock()
		return
	}
	l.state = st
	l.timer.Stop()
	close(l.done)
	l.mu.Unlock()
	if l.onEnd != nil {
		l.onEnd()
	}
}

// Refresh extends the lease on every node at once and succeeds when a
// majority extended it in time: the new validity is TTL − round time −
// drift from the start of the round.
func (l *lease) Refresh(ctx context.Context, ttl time.Duration) error {
	if err := lock.ValidateTTL(ttl); err != nil {
		return err
	}
	if l.finished() {
		return fmt.Errorf("redlockstore: refresh %q: %w", l.key, lock.ErrLockLost)
	}
	s := l.s
	start := time.Now()
	idx := l.targets()
	n := len(idx)
	ch := s.call(idx, func(c context.Context, nd *node) ([]int64, error) {
		v, err := redislua.Refresh.Run(c, nd.c, []string{s.names.Lock(l.key), s.names.Owner(l.key)}, l.token, ttl.Milliseconds()).Int64()
		return []int64{v}, err
	})
	ok, notOurs := 0, 0
	failed := map[int]error{}
	answered := map[int]bool{}
	_, timedOut, ctxErr := collect(ctx, ch, n, s.nodeTimeout(ttl), func(r reply) bool {
		answered[r.i] = true
		switch {
		case r.err != nil:
			failed[r.i] = r.err
		case r.v[0] == 1:
			ok++
		default:
			notOurs++
		}
		return ok >= s.quorum || notOurs+len(failed) > n-s.quorum
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
		deadline := start.Add(ttl - s.drift(ttl))
		if time.Until(deadline) <= 0 {
			return fmt.Errorf("redlockstore: refresh %q: the round outlasted the TTL %s", l.key, ttl)
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.state != held {
			return fmt.Errorf("redlockstore: refresh %q: %w", l.key, lock.ErrLockLost)
		}
		l.deadline = deadline
		l.timer.Reset(time.Until(deadline))
		return nil
	case ctxErr != nil:
		return fmt.Errorf("redlockstore: refresh %q: %w", l.key, ctxErr)
	case notOurs > n-s.quorum:
		l.finish(lost)
		return fmt.Errorf("redlockstore: refresh %q: %w", l.key, lock.ErrLockLost)
	default:
		return s.quorumError("refresh", l.key, ok, failed)
	}
}

// Release deletes the lease on every node and announces it on each,
// returning once the outcome is decided. It returns nil when a majority
// deleted it, ErrLockLost when a majority no
// longer held it, and a *QuorumError when too many nodes were unreachable;
// in every case the lease ends here (keys left on unreachable nodes expire
// with their TTL) and a second Release returns nil.
func (l *lease) Release(ctx context.Context) error {
	l.mu.Lock()
	st := l.state
	l.mu.Unlock()
	if st == released {
		return nil
	}
	if ctx.Err() != nil {
		var cancel context.CancelFunc
		ctx, cancel = lock.CleanupContext(ctx)
		defer cancel()
	}
	s := l.s
	idx := l.targets()
	n := len(idx)
	ch := s.call(idx, func(c context.Context, nd *node) ([]int64, error) {
		v, err := redislua.Release.Run(c, nd.c, s.releaseKeys(l.key), l.token,
			s.names.Channel(l.key), s.opts.pubsub.ScriptArg(), s.wakeGrace()).Int64()
		return []int64{v}, err
	})
	ok, notOurs := 0, 0
	failed := map[int]error{}
	answered := map[int]bool{}
	_, timedOut, ctxErr := collect(ctx, ch, n, s.nodeTimeout(time.Until(l.deadline)), func(r reply) bool {
		answered[r.i] = true
		switch {
		case r.err != nil:
			failed[r.i] = r.err
		case r.v[0] == 1 || r.v[0] == 2: // let go, or one of an owner's holds given back
			ok++
		default:
			notOurs++
		}
		return ok >= s.quorum || notOurs > n-s.quorum || notOurs+len(failed) > n-s.quorum
	})
	if timedOut {
		for _, i := range idx {
			if !answered[i] {
				failed[i] = errNodeTimeout
			}
		}
	}
	l.finish(released)
	switch {
	case ok >= s.quorum:
		return nil
	case ctxErr != nil:
		return fmt.Errorf("redlockstore: release %q: %w", l.key, ctxErr)
	case notOurs > n-s.quorum:
		return fmt.Errorf("redlockstore: release %q: %w", l.key, lock.ErrLockLost)
	default:
		return s.quorumError("release", l.key, ok, failed)
	}
}

// targets are the nodes the lease's rounds go to.
func (l *lease) targets() []int {
	if l.nodes != nil {
		return l.nodes
	}
	return l.s.all()
}
