package redlockstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/core/lock"
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

	bg        sync.WaitGroup // requests past their round, and their clean-up
	closed    chan struct{}
	closeOnce sync.Once
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
	lease *lease
	held  *lock.HeldError // the key is held: wait for it
	split bool            // we took some nodes, not a majority: back off
	err   error           // a *QuorumError, a ctx error, or a failed fencing round
}

// attempt makes one Redlock acquisition: round one takes the key on every
// node it can (SET NX PX, INCR of the node's fence counter); with a
// majority and validity left, round two (fenced mode) writes the highest
// counter back to the acquired nodes where the key is still ours and needs
// a majority too. A failed attempt releases every node it took, including
// ones whose answer arrives late.
func (s *Store) attempt(ctx context.Context, key string, ttl time.Duration, onEnd func()) outcome {
	tok := token.New()
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
	keys := []string{s.names.Lock(key), s.names.Fence(key)}
	ch := s.call(s.all(), func(c context.Context, n *node) ([]int64, error) {
		return redislua.Acquire.Run(c, n.c, keys, tok, ttl.Milliseconds(), deadline.UnixMilli(), fenced).Int64Slice()
	})
	var (
		n        = len(s.nodes)
		acquired = map[int]int64{}
		held     = map[int]int64{}
		failed   = map[int]error{}
		answered = make([]bool, n)
	)
	classify := func(r reply) {
		answered[r.i] = true
		switch {
		case r.err != nil:
			failed[r.i] = r.err
		case len(r.v) != 2:
			failed[r.i] = fmt.Errorf("unexpected script reply %v", r.v)
		case r.v[0] == 1:
			acquired[r.i] = r.v[1]
		case r.v[0] == 0:
			held[r.i] = r.v[1]
		default:
			failed[r.i] = errLate
		}
	}
	pending, timedOut, ctxErr := collect(ctx, ch, n, nt, func(r reply) bool {
		classify(r)
		return len(acquired) >= s.quorum || len(held)+len(failed) > n-s.quorum
	})
	if timedOut {
		for i := range n {
			if !answered[i] {
				failed[i] = errNodeTimeout
			}
		}
	}

	// Late answers to round one: a node taken after the attempt failed, or
	// after its lease ended, is released again.
	decided := make(chan struct{})
	var granted *lease
	if pending > 0 {
		s.bg.Go(func() {
			for range pending {
				r := <-ch
				if r.err != nil || len(r.v) != 2 || r.v[0] != 1 {
					continue
				}
				<-decided
				if granted == nil || granted.finished() {
					s.releaseNodes(key, tok, []int{r.i}, 0)
				}
			}
		})
	}
	fail := func(o outcome) outcome {
		close(decided)
		if len(acquired) > 0 {
			s.releaseNodes(key, tok, indexes(acquired), nt)
		}
		return o
	}

	if ctxErr != nil {
		return fail(outcome{err: errors.Join(lock.ErrNotAcquired, ctxErr)})
	}
	if len(acquired) < s.quorum {
		switch {
		case len(failed) > 0 && len(acquired)+len(failed) >= s.quorum:
			return fail(outcome{err: s.quorumError("acquire", key, len(acquired), failed)})
		case len(acquired) > 0:
			return fail(outcome{split: true, held: &lock.HeldError{Key: key, TTL: 0}})
		default:
			return fail(outcome{held: &lock.HeldError{Key: key, TTL: s.holdWait(held)}})
		}
	}
	drift := s.drift(ttl)
	if ttl-time.Since(start)-drift <= 0 {
		return fail(outcome{split: true, err: fmt.Errorf("redlockstore: acquire %q: %w: the round took %s of a %s TTL",
			key, lock.ErrNotAcquired, time.Since(start).Round(time.Microsecond), ttl)})
	}

	var fence uint64
	if s.opts.fenced {
		var err error
		fence, err = s.writeBack(ctx, key, tok, acquired, nt)
		if err != nil {
			return fail(outcome{split: !errors.Is(err, ErrNoQuorum) && ctx.Err() == nil, err: err})
		}
		if ttl-time.Since(start)-drift <= 0 {
			return fail(outcome{split: true, err: fmt.Errorf("redlockstore: acquire %q: %w: two rounds took %s of a %s TTL",
				key, lock.ErrNotAcquired, time.Since(start).Round(time.Microsecond), ttl)})
		}
	}
	granted = newLease(s, key, tok, fence, start.Add(ttl-drift), onEnd)
	close(decided)
	return outcome{lease: granted}
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
	keys := []string{s.names.Lock(key), s.names.Fence(key)}
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

// releaseNodes runs the release script for tok on the nodes in idx and
// waits up to wait for their answers (0: does not wait).
func (s *Store) releaseNodes(key, tok string, idx []int, wait time.Duration) {
	ch := s.call(idx, func(c context.Context, n *node) ([]int64, error) {
		v, err := redislua.Release.Run(c, n.c, []string{s.names.Lock(key)}, tok, s.names.Channel(key), s.opts.pubsub.ScriptArg()).Int64()
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
	out := s.attempt(ctx, key, ttl, nil)
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
// nodes. It waits for a release message from any node, the holder's
// remaining TTL on the nodes that block a majority, or the recheck interval.
// Nodes that cannot be reached are retried with backoff until ctx ends; the
// error then matches ErrNotAcquired, ctx.Err() and, when nodes were down,
// ErrNoQuorum.
func (s *Store) Acquire(ctx context.Context, key string, ttl time.Duration) (lock.Lease, error) {
	if err := s.check(ctx, key, ttl); err != nil {
		return nil, err
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

func (s *Store) acquire(ctx context.Context, key string, ttl time.Duration, onEnd func()) (*lease, error) {
	var (
		mw      *multiWatch
		backoff = s.opts.minBackoff
		lastErr error
		timer   = time.NewTimer(time.Hour)
	)
	defer timer.Stop()
	defer func() {
		if mw != nil {
			mw.close()
		}
	}()
	for {
		out := s.attempt(ctx, key, ttl, onEnd)
		if out.lease != nil {
			return out.lease, nil
		}
		if ctx.Err() != nil {
			return nil, errors.Join(lock.ErrNotAcquired, ctx.Err(), lastErr)
		}
		var (
			wait      time.Duration
			listening = mw != nil
		)
		switch {
		case out.split || out.err != nil:
			// A split vote or a failed round: back off with full jitter and
			// without listening for releases, or competitors woken by the
			// same message would split again.
			if out.err != nil {
				lastErr = out.err
			}
			wait = rand.N(backoff + 1)
			backoff = min(2*backoff, s.opts.maxBackoff)
			listening = false
		case mw == nil:
			// Held: subscribe on every node, then try again at once, so a
			// release between the attempt and the subscription is not missed.
			mw = s.watchAll(key)
			continue
		default:
			backoff = s.opts.minBackoff
			wait = s.opts.recheck
			if t := out.held.TTL; t >= 0 && t < wait {
				wait = t + time.Millisecond
			}
		}
		timer.Reset(wait)
		var wake <-chan struct{}
		if listening {
			wake = mw.wake
		}
		select {
		case <-wake:
		case <-timer.C:
		case <-s.closed:
			return nil, fmt.Errorf("redlockstore: acquire %q: %w", key, lock.ErrClosed)
		case <-ctx.Done():
			return nil, errors.Join(lock.ErrNotAcquired, ctx.Err(), lastErr)
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
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

// watchAll subscribes on every node and returns once a majority confirmed
// (or could not), or after the node timeout for the slow ones.
func (s *Store) watchAll(key string) *multiWatch {
	mw := &multiWatch{wake: make(chan struct{}, 1), stop: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{}, len(s.nodes))
	for _, n := range s.nodes {
		s.bg.Go(func() {
			w, err := n.sub.Watch(ctx, s.names.Channel(key))
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
	s.bg.Go(func() {
		<-mw.stop
		cancel()
	})
	t := time.NewTimer(s.nodeTimeout(time.Second))
	defer t.Stop()
	for range s.quorum {
		select {
		case <-ready:
		case <-t.C:
			return mw
		}
	}
	return mw
}

func (mw *multiWatch) close() { close(mw.stop) }

var (
	_ lock.Locker = (*Store)(nil)
	_ lock.Lease  = (*lease)(nil)
)
