package redlockstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"time"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/lock/lockdriver"
	"github.com/oncekit/oncekit/core/observe"
)

// candidateRounds bounds how many extra rounds a client holding the
// leader node spends completing its majority (after 1, 2, 4, 8 ms) before
// it gives up its nodes.
const candidateRounds = 4

// waiting is one Acquire waiting for a key on the nodes: the first of this
// Store's waiters for the key (the others queue locally).
type waiting struct {
	s     *Store
	key   string
	ttl   time.Duration
	onEnd func() // frees the Store's local queue slot

	votes     *votes
	watch     *multiWatch // release channels on the queue nodes, once subscribed
	queued    bool        // a member of the key's waiting queues
	place     int64       // its place in them: when it began waiting (µs)
	taken     []int       // the nodes of the lease acquired
	backoff   time.Duration
	candidate int       // extra rounds spent completing a split majority
	joinNow   bool      // try again at once, as a member of the queues
	held      bool      // the last round found the key held, every node answering: the next, unless woken, asks the queue nodes only
	waited    bool      // an attempt found the key held
	lastErr   error     // the last failed round, for the final error
	noQuorum  time.Time // since when rounds have failed for want of a quorum
	woken     time.Time // when the last release notice woke us
	timer     *time.Timer
}

// run attempts until the key is taken or ctx ends.
func (w *waiting) run(ctx context.Context) (l *lease, err error) {
	w.timer = time.NewTimer(time.Hour)
	defer w.timer.Stop()
	defer func() { w.leave(l != nil) }()
	nt := w.s.nodeTimeout(w.ttl)
	for {
		var only []int
		if w.queued && w.held && w.woken.IsZero() {
			// The key was held and no release has woken us: this round
			// joins the queues (or finds the holder gone), and the queue
			// nodes are a majority — the other nodes would only answer
			// busy.
			only = w.s.queueNodes(w.key)
		}
		out := w.s.attempt(ctx, w.votes, w.ttl, w.onEnd, w.queued, w.place, only)
		// Held as far as every node asked could tell: a round with a node
		// down may not reach a majority of the queue nodes at all.
		w.held = out.busy != nil && !out.split && out.err == nil && !out.failed
		if out.lease != nil {
			w.won(ctx, out)
			return out.lease, nil
		}
		if out.busy != nil {
			w.waited = true
		}
		w.woken = time.Time{}
		if out.err != nil && ctx.Err() == nil {
			w.lastErr = out.err // kept for the final error when ctx ends
		}
		if ctx.Err() != nil {
			w.votes.giveUp(nt, false)
			return nil, lockdriver.NotAcquired(ctx, w.lastErr)
		}
		if err := w.checkQuorum(out.err); err != nil {
			w.votes.giveUp(nt, false)
			return nil, err
		}
		if w.watch == nil && w.join(out) {
			continue
		}
		if out.split && out.leader && w.candidate < candidateRounds {
			// A split vote, and we hold the leader node: the others see that
			// they do not and give their nodes up, which wakes us. Keep ours
			// and take the rest.
			if err := w.sleep(ctx, time.Millisecond<<w.candidate, nil); err != nil {
				w.votes.giveUp(nt, false)
				return nil, err
			}
			w.candidate++
			continue
		}
		if err := w.backOff(ctx, out); err != nil {
			return nil, err
		}
	}
}

// checkQuorum returns the error to give up with once rounds have failed
// for want of a quorum for longer than WithQuorumWait.
func (w *waiting) checkQuorum(err error) error {
	if !errors.Is(err, ErrNoQuorum) {
		w.noQuorum = time.Time{}
		return nil
	}
	if w.noQuorum.IsZero() {
		w.noQuorum = time.Now()
	}
	if d := w.s.redlock.quorumWait; d > 0 && time.Since(w.noQuorum) >= d {
		return errors.Join(lock.ErrNotAcquired, err)
	}
	return nil
}

// join subscribes on the key's queue nodes — to the key's release channel and to
// this Store's own — and makes the waiter a member of the key's waiting
// queues. It reports whether to try again at once: a release between the
// first attempt and the subscription is not missed, and from now on a
// release wakes only the first waiting process.
func (w *waiting) join(out outcome) bool {
	w.subscribe()
	if out.err == nil && !out.split {
		return true
	}
	w.joinNow = out.err == nil // after settling the split
	return false
}

// subscribe watches the key's release channel and this Store's own on
// key's queue nodes, and makes the waiter's next attempts members of the key's
// waiting queues.
func (w *waiting) subscribe() {
	// Only the key's queue nodes announce its releases (queueNode).
	w.watch = w.s.watchChannels(w.s.queueNodes(w.key), w.s.base.Keys.Channel(w.key), w.s.base.OwnChannel(w.key))
	w.queued, w.place = true, time.Now().UnixMicro()
}

// won reports a notified hand-off.
func (w *waiting) won(ctx context.Context, out outcome) {
	w.taken = out.taken
	if !w.woken.IsZero() {
		observe.Record(ctx, w.s.base.Options.Observer, observe.Event{
			Op: observe.LockHandOff, Driver: driverName, Key: w.key, Outcome: observe.Notified,
			Fence: out.lease.Fence(), Duration: time.Since(w.woken),
		})
	}
}

// leave closes the subscriptions and leaves the queues: every queue node when
// leaving without the key, the nodes not taken (where the place stayed)
// with it.
func (w *waiting) leave(won bool) {
	if w.watch != nil {
		w.watch.close()
	}
	if !w.queued {
		return
	}
	idx := w.s.queueNodes(w.key)
	if won {
		idx = slices.DeleteFunc(idx, func(i int) bool { return slices.Contains(w.taken, i) })
	}
	w.s.leaveQueues(w.key, idx, w.s.nodeTimeout(w.ttl))
}

// backOff gives the round's nodes up and sleeps until the next attempt.
func (w *waiting) backOff(ctx context.Context, out outcome) error {
	// Split-vote losers whose rival holds the leader node give their
	// nodes back quietly: the rival takes them, and announces its own
	// release later. Everyone else announces the release, or nobody
	// would be woken.
	w.votes.giveUp(w.s.nodeTimeout(w.ttl), out.split && out.rival && out.err == nil)
	w.votes, w.candidate = w.s.newVotes(w.key), 0
	var (
		wait time.Duration
		wake = w.watch.wake
	)
	switch {
	case out.err != nil || (out.split && !out.rival):
		// A failed round, a candidate that could not complete, or a
		// split nobody settles (the leader node free): back off with
		// full jitter, deaf to releases, so that competitors woken by
		// the same message do not collide again.
		wait = rand.N(w.backoff + 1)
		w.backoff = min(2*w.backoff, w.s.base.MaxBackoff)
		wake = nil
	case out.split:
		// Someone else holds the leader node and will win: wait for it,
		// and spread the next attempts of the woken. Not past the end of
		// its hold there: when it is only kept for a woken waiter that
		// never comes (it died), nothing announces that the grace ran out.
		wait = w.s.base.Recheck
		if t := out.rivalTTL; t >= 0 && t < wait {
			wait = t + time.Millisecond
		}
		w.backoff = min(2*w.backoff, w.s.base.MaxBackoff)
	default:
		wait = w.s.base.Recheck
		if t := out.busy.TTL; t >= 0 && t < wait {
			wait = t + time.Millisecond
		}
		if w.watch.deaf() {
			// Some node may announce the release where we do not listen:
			// poll within the backoff instead of sleeping the recheck.
			wait = min(wait, w.backoff/2+rand.N(w.backoff/2+1))
			w.backoff = min(2*w.backoff, w.s.base.MaxBackoff)
		}
	}
	if w.joinNow {
		// A split vote on the first attempt, which was not queued: this
		// waiter is in no queue yet, so no release would wake it.
		wait, w.joinNow = 0, false
	}
	w.watch.announced.Store(0)
	if err := w.sleep(ctx, wait, wake); err != nil {
		return err
	}
	if !w.woken.IsZero() && w.watch.personal.Load() {
		w.gather()
		return nil
	}
	if wake != nil && w.backoff > w.s.base.MinBackoff && !w.watch.personal.Load() {
		// Woken on the general channel, with contention since this waiter
		// last held the key: the other processes woken by the same release
		// compete too. Spread the attempts over the backoff window, deaf to
		// further messages. (A release on this Store's own channel woke it
		// alone, and the key is reserved for it: it tries at once.)
		return w.sleep(ctx, rand.N(w.backoff+1), nil)
	}
	return nil
}

// gatherWait bounds how long a waiter woken on its own channel waits for
// the release to be announced by a majority of the nodes (gather). The
// releaser sends to every node at once, so the messages come within the
// spread of the nodes' answers; the bound only matters when messages are
// lost, and then the attempt goes ahead as it would have without waiting.
const gatherWait = 3 * time.Millisecond

// gather waits, after a release woke this waiter on its own channel, until
// a majority of the nodes have announced it there — every queue node, the
// only ones that announce — or gatherWait passed.
// The first node's message can come before the other nodes have processed
// the release (the releaser sends to all at once): an attempt sent at
// once would find the key still held on them, and lose a round.
func (w *waiting) gather() {
	if w.watch.announced.Load() >= int32(w.s.quorum) || w.watch.deaf() {
		return // a majority announced it, or some node may not tell us
	}
	t := time.NewTimer(gatherWait)
	defer t.Stop()
	for w.watch.announced.Load() < int32(w.s.quorum) {
		select {
		case <-w.watch.wake:
		case <-t.C:
			return
		}
	}
}

// sleep waits d, or until wake (if not nil) receives.
func (w *waiting) sleep(ctx context.Context, d time.Duration, wake <-chan struct{}) error {
	w.timer.Reset(d)
	defer func() {
		if !w.timer.Stop() {
			select {
			case <-w.timer.C:
			default:
			}
		}
	}()
	select {
	case <-wake:
		w.woken = time.Now()
	case <-w.timer.C:
	case <-w.s.closed:
		return fmt.Errorf("redlockstore: acquire %q: %w", w.key, lock.ErrClosed)
	case <-ctx.Done():
		return lockdriver.NotAcquired(ctx, w.lastErr)
	}
	return nil
}

// multiWatch is a waiter's subscription to a key's release channels on
// several nodes: a message from any of them wakes it.
type multiWatch struct {
	wake      chan struct{}
	personal  atomic.Bool  // the last wake came on this Store's own channel
	announced atomic.Int32 // messages on this Store's own channel since the waiter last slept
	stop      chan struct{}
	want      int32        // subscriptions asked for
	confirmed atomic.Int32 // subscriptions the servers confirmed
}

// deaf reports whether some subscription is not confirmed: a release
// announced there would not reach the waiter, which must then poll rather
// than sleep the whole recheck interval.
func (mw *multiWatch) deaf() bool { return mw.confirmed.Load() < mw.want }

// watchChannels subscribes to channels on the nodes in idx and returns once
// every subscription is confirmed, or could not be made, or after the node
// timeout for the slow ones; suspect nodes (paused, unreachable) are not
// waited for. A waiter joins the key's queues only after this: a release
// announced on its own channel before it listens would be lost, and cost
// it the recheck interval. A message on any channel, from any node, wakes
// the waiter.
func (s *Store) watchChannels(idx []int, channels ...string) *multiWatch {
	mw := &multiWatch{wake: make(chan struct{}, 1), stop: make(chan struct{}), want: int32(len(idx) * len(channels))}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{}, len(idx)*len(channels))
	waitFor := 0
	for _, i := range idx {
		n := s.nodes[i]
		if !n.isSuspect() {
			waitFor += len(channels)
		}
		for j, channel := range channels {
			s.watchOne(ctx, mw, n, channel, j > 0, ready)
		}
	}
	s.base.BG.Go(func() {
		<-mw.stop
		cancel()
	})
	t := time.NewTimer(s.nodeTimeout(time.Second))
	defer t.Stop()
	for range waitFor {
		select {
		case <-ready:
		case <-t.C:
			return mw
		}
	}
	return mw
}

// watchOne forwards channel's messages on n to mw until mw stops.
// personal marks the Store's own channel, where a release wakes this
// waiter alone.
func (s *Store) watchOne(ctx context.Context, mw *multiWatch, n *node, channel string, personal bool, ready chan<- struct{}) {
	s.base.BG.Go(func() {
		w, err := n.sub.Watch(ctx, channel)
		if err == nil && w.Subscribed() {
			mw.confirmed.Add(1)
		}
		ready <- struct{}{}
		if err != nil {
			return
		}
		defer n.sub.Unwatch(w)
		for {
			select {
			case <-w.Wake():
				mw.personal.Store(personal)
				if personal {
					mw.announced.Add(1)
				}
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
