package redisstore

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/observe"
	"github.com/oncekit/oncekit/internal/bg"
	"github.com/oncekit/oncekit/internal/redislua"
	"github.com/oncekit/oncekit/internal/redisnotify"
	"github.com/oncekit/oncekit/internal/token"
)

// Client is the part of go-redis the Store uses. redis.UniversalClient
// (*redis.Client, *redis.ClusterClient, a Sentinel failover client, *redis.Ring)
// satisfies it.
type Client interface {
	redis.Scripter
	Subscribe(ctx context.Context, channels ...string) *redis.PubSub
	SSubscribe(ctx context.Context, channels ...string) *redis.PubSub
	Info(ctx context.Context, section ...string) *redis.StringCmd
	HGet(ctx context.Context, key, field string) *redis.StringCmd
}

// Store is a lock.Locker over one Redis deployment. It is safe for
// concurrent use; Close releases its pub/sub connection.
//
// Goroutines of one Store that wait for the same key queue up locally, first
// come first served, and only the first of them competes in Redis. When a
// lease of the Store is released while others of the same Store wait, the
// key is handed straight to the next one in a single round trip (a new
// token and a new fence, without letting go of the key), up to
// WithMaxLocalHandOffs times in a row before the key is let go so that
// other processes get their turn.
type Store struct {
	client Client
	opts   options
	names  redislua.Keys
	sub    *redisnotify.Subscriber

	mu   sync.Mutex
	keys map[string]*local

	bg bg.Group // requests the caller stopped waiting for, and their clean-up

	id string // this Store's name in the keys' waiting queues
}

// local is what one Store knows of a key: its own lease on it and its own
// waiters for it.
type local struct {
	holder      *lease    // this Store's live lease on the key, or nil
	handing     bool      // a hand-over to a queued waiter is in flight
	competitors int       // waiters trying Redis
	queue       list.List // *waiter, first come first served
	handOffs    int       // hand-overs since the key was last let go
}

// waiter is a blocked Acquire.
type waiter struct {
	ttl   time.Duration
	owner string
	token string
	ev    chan event    // buffered(1): at most one event is outstanding
	elem  *list.Element // non-nil while queued
}

// event tells a queued waiter that it got the key (lease) or that it is its
// turn to compete for it in Redis.
type event struct {
	lease *lease
	freed time.Time // when the hand-over began
}

// New returns a Store over client. It makes no request until first used.
func New(client Client, opts ...Option) (*Store, error) {
	if client == nil {
		return nil, errors.New("redisstore: New: nil client")
	}
	o := defaultOptions()
	for _, opt := range opts {
		opt(&o)
	}
	if err := o.validate(); err != nil {
		return nil, fmt.Errorf("redisstore: New: %w", err)
	}
	return &Store{
		client: client,
		opts:   o,
		names:  redislua.Keys{Prefix: o.prefix},
		id:     token.New(),
		sub:    redisnotify.New(client, o.pubsub),
		keys:   make(map[string]*local),
	}, nil
}

// Close stops the Store's pub/sub connection and wakes its waiters, which
// then fail with lock.ErrClosed, and waits for requests that callers
// stopped waiting for (a cancelled Acquire) to finish their clean-up. Leases taken earlier stay valid and can
// still be refreshed and released. Close does not close the client.
func (s *Store) Close() error {
	err := s.sub.Close()
	s.bg.Wait()
	return err
}

const driverName = "redis"

// DriverName implements observe.Source: "redis".
func (s *Store) DriverName() string { return driverName }

// Observer implements observe.Source: the WithObserver option.
func (s *Store) Observer() observe.Observer { return s.opts.observer }

func (s *Store) lockKey(key string) string  { return s.names.Lock(key) }
func (s *Store) fenceKey(key string) string { return s.names.Fence(key) }
func (s *Store) channel(key string) string  { return s.names.Channel(key) }
func (s *Store) modeArg() string            { return s.opts.pubsub.ScriptArg() }

func (s *Store) localLocked(key string) *local {
	ls := s.keys[key]
	if ls == nil {
		ls = &local{}
		s.keys[key] = ls
	}
	return ls
}

func (s *Store) dropIdleLocked(key string, ls *local) {
	if ls.holder == nil && !ls.handing && ls.competitors == 0 && ls.queue.Len() == 0 && s.keys[key] == ls {
		delete(s.keys, key)
	}
}

// promoteLocked lets the first queued waiter compete in Redis when nobody
// of this Store holds or competes for the key.
func (s *Store) promoteLocked(key string, ls *local) {
	if ls.holder != nil || ls.handing || ls.competitors > 0 {
		return
	}
	front := ls.queue.Front()
	if front == nil {
		s.dropIdleLocked(key, ls)
		return
	}
	w := ls.queue.Remove(front).(*waiter)
	w.elem = nil
	ls.competitors++
	w.ev <- event{}
}

// TryAcquire implements lock.Locker: one round trip, or none when a lease
// of this Store holds the key.
func (s *Store) TryAcquire(ctx context.Context, key string, ttl time.Duration) (lock.Lease, error) {
	if err := lock.Validate(key, ttl); err != nil {
		return nil, err
	}
	owner := lock.Owner(ctx)
	if err := lock.ValidateOwner(owner); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, errors.Join(lock.ErrNotAcquired, err)
	}
	s.mu.Lock()
	if ls := s.keys[key]; ls != nil && ls.holder != nil && (owner == "" || ls.holder.owner != owner) {
		ttl := ls.holder.remaining()
		s.mu.Unlock()
		return nil, &lock.HeldError{Key: key, TTL: ttl}
	}
	s.mu.Unlock()
	l, held, err := s.attempt(ctx, key, token.New(), ttl, owner)
	if err != nil {
		return nil, err
	}
	if held != nil {
		return nil, held
	}
	s.adopt(l)
	return l, nil
}

// adopt records a lease taken in Redis as this Store's holder of its key,
// unless one is recorded already (an owner's re-entry).
func (s *Store) adopt(l *lease) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ls := s.localLocked(l.key); ls.holder == nil {
		ls.holder = l
	}
}

// Acquire implements lock.Locker. An uncontended call is one round trip.
// While the key is held, the caller waits in this Store's queue for the
// key; the first in the queue subscribes to the key's release channel (one
// shared connection per Store) and tries again when the holder releases,
// when the holder's remaining TTL runs out, or at the latest after the
// recheck interval.
func (s *Store) Acquire(ctx context.Context, key string, ttl time.Duration) (lock.Lease, error) {
	if err := lock.Validate(key, ttl); err != nil {
		return nil, err
	}
	owner := lock.Owner(ctx)
	if err := lock.ValidateOwner(owner); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, errors.Join(lock.ErrNotAcquired, err)
	}
	if owner != "" {
		// An owner first tries the key directly: it may hold it already,
		// here or in another process, and must not queue behind waiters for
		// its own lock.
		l, held, err := s.attempt(ctx, key, token.New(), ttl, owner)
		if err != nil {
			return nil, err
		}
		if held == nil {
			s.adopt(l)
			return l, nil
		}
	}
	w := &waiter{ttl: ttl, owner: owner, token: token.New(), ev: make(chan event, 1)}
	s.mu.Lock()
	ls := s.localLocked(key)
	if ls.holder == nil && !ls.handing && ls.competitors == 0 && ls.queue.Len() == 0 {
		ls.competitors++
		s.mu.Unlock()
		return s.compete(ctx, key, ls, w)
	}
	w.elem = ls.queue.PushBack(w)
	s.mu.Unlock()

	var quit error
	select {
	case e := <-w.ev:
		if e.lease != nil {
			s.handedOff(ctx, e)
			return e.lease, nil
		}
		return s.compete(ctx, key, ls, w)
	case <-ctx.Done():
		quit = errors.Join(lock.ErrNotAcquired, ctx.Err())
	case <-s.sub.Closed():
		quit = fmt.Errorf("redisstore: acquire %q: %w", key, lock.ErrClosed)
	}
	s.mu.Lock()
	if w.elem != nil { // still queued: leave, nothing to undo
		ls.queue.Remove(w.elem)
		w.elem = nil
		s.dropIdleLocked(key, ls)
		s.mu.Unlock()
		return nil, quit
	}
	s.mu.Unlock()
	// An event is on its way: a hand-over in flight, or our turn.
	if e := <-w.ev; e.lease != nil {
		s.handedOff(ctx, e)
		return e.lease, nil // the acquisition happened; it is the caller's
	}
	s.mu.Lock()
	ls.competitors--
	s.promoteLocked(key, ls)
	s.mu.Unlock()
	return nil, quit
}

// compete tries Redis until the key is taken or ctx ends. The caller has
// counted w in ls.competitors.
func (s *Store) compete(ctx context.Context, key string, ls *local, w *waiter) (_ lock.Lease, err error) {
	var l *lease
	defer func() {
		s.mu.Lock()
		ls.competitors--
		if l != nil {
			ls.holder = l
		} else {
			s.promoteLocked(key, ls)
		}
		s.dropIdleLocked(key, ls)
		s.mu.Unlock()
	}()
	l, held, err := s.attempt(ctx, key, w.token, w.ttl, w.owner)
	if err != nil || held == nil {
		return l, err
	}
	// Wait in the key's queue of processes: a release wakes only the first
	// of them, on its own channel; the general channel carries releases
	// when nobody is queued (and on servers before Redis 7).
	sw, err := s.sub.Watch(ctx, s.myChannel(key))
	if err != nil {
		return nil, err
	}
	defer s.sub.Unwatch(sw)
	gw, err := s.sub.Watch(ctx, s.channel(key))
	if err != nil {
		return nil, err
	}
	defer s.sub.Unwatch(gw)
	defer func() {
		if l == nil { // leaving without the key: give the place up
			s.bg.Go(func() { s.dequeue(key) })
		}
	}()
	backoff := s.opts.minBackoff
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var woken time.Time // when the last release notice arrived
	for {
		// Subscribed first, then tried: a release between the two is seen.
		l, held, err = s.attemptAs(ctx, key, w.token, w.ttl, w.owner, s.id)
		if err != nil || held == nil {
			if l != nil && !woken.IsZero() {
				observe.Record(ctx, s.opts.observer, observe.Event{
					Op: observe.LockHandOff, Driver: driverName, Key: key, Outcome: observe.Notified,
					Fence: l.fence, Duration: time.Since(woken),
				})
			}
			return l, err
		}
		woken = time.Time{}
		wait := s.opts.recheck
		switch {
		case !sw.Subscribed() || !gw.Subscribed() || held.TTL < 0:
			wait = min(wait, backoff/2+rand.N(backoff/2+1))
			backoff = min(2*backoff, s.opts.maxBackoff)
		case held.TTL < wait:
			wait = held.TTL + time.Millisecond
		}
		timer.Reset(wait)
		select {
		case <-sw.Wake():
			woken = time.Now()
		case <-gw.Wake():
			woken = time.Now()
		case <-timer.C:
		case <-s.sub.Closed():
			return nil, fmt.Errorf("redisstore: acquire %q: %w", key, lock.ErrClosed)
		case <-ctx.Done():
			return nil, errors.Join(lock.ErrNotAcquired, ctx.Err())
		}
	}
}

// attempt runs the acquire script once. It returns a lease, or a
// *lock.HeldError, or an error. Nothing is left behind by a failed attempt:
// after an error that may have come after the script ran (a timeout, a
// cancelled ctx, a broken connection) it gives back whatever the attempt
// may have taken, and the script itself refuses to take the key once ctx's
// deadline has passed by the server's clock, for a request that reaches the
// server late (a paused server, a slow network) when the clean-up cannot.
func (s *Store) attempt(ctx context.Context, key, tok string, ttl time.Duration, owner string) (*lease, *lock.HeldError, error) {
	return s.attemptAs(ctx, key, tok, ttl, owner, "")
}

// dequeue removes this Store from key's waiting queue.
func (s *Store) dequeue(key string) {
	ctx, cancel := context.WithTimeout(context.Background(), lock.ReleaseTimeout)
	defer cancel()
	_ = s.client.Eval(ctx, "redis.call('ZREM', KEYS[1], ARGV[1]); redis.call('HDEL', KEYS[2], ARGV[1]); return 1",
		[]string{s.names.Queue(key), s.names.QueueExpiry(key)}, s.id).Err()
}

// releaseKeys are the keys of the release script: lock, owner hash, and
// the waiting queue it wakes the first member of.
func (s *Store) releaseKeys(key string) []string {
	return []string{s.lockKey(key), s.names.Owner(key), s.names.Queue(key), s.names.QueueExpiry(key)}
}

// wakeGrace is how long a waiting process a release wakes keeps its place
// in the key's queue without trying again (it tries at once), in
// milliseconds: a process that died while queued is woken once, then
// skipped.
func (s *Store) wakeGrace() int64 { return (4 * s.opts.maxBackoff).Milliseconds() }

// myChannel is where releases of key are announced to this Store when it
// is first in the key's waiting queue.
func (s *Store) myChannel(key string) string { return s.channel(key) + ":" + s.id }

// attemptAs is attempt for a member of the key's waiting queue ("" for
// none): when the key is held, the member joins the queue.
func (s *Store) attemptAs(ctx context.Context, key, tok string, ttl time.Duration, owner, member string) (*lease, *lock.HeldError, error) {
	start := time.Now()
	var deadline int64
	if d, ok := ctx.Deadline(); ok {
		deadline = d.UnixMilli()
	}
	undo := func(tok string) {
		cctx, cancel := lock.CleanupContext(ctx)
		defer cancel()
		_ = redislua.Release.Run(cctx, s.client, s.releaseKeys(key),
			tok, s.channel(key), s.modeArg(), s.wakeGrace()).Err()
	}
	late := func(cmd *redis.Cmd) { // the reply to a call ctx gave up on
		if r, err := redislua.ParseAcquire(cmd); err == nil && r.Code == 1 {
			undo(tok)
		} else if err == nil && r.Code == 2 {
			undo(r.Token)
		}
	}
	r, err := redislua.ParseAcquire(redislua.Run(ctx, &s.bg, s.client, redislua.Acquire,
		[]string{s.lockKey(key), s.fenceKey(key), s.names.Owner(key), s.names.Queue(key), s.names.QueueExpiry(key)}, late,
		tok, ttl.Milliseconds(), deadline, 1, owner, member, (3 * s.opts.recheck).Milliseconds()))
	if err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, nil, errors.Join(lock.ErrNotAcquired, ctxErr)
		}
		if !isRedisReply(err) && owner == "" {
			// The script may have run before the connection failed. (An
			// owner's uncertain re-entry cannot be told from its other
			// holds; its expiry bounds it.)
			s.bg.Go(func() { undo(tok) })
		}
		return nil, nil, fmt.Errorf("redisstore: acquire %q: %w", key, err)
	}
	switch r.Code {
	case 1:
		return newLease(s, key, tok, uint64(r.N), start, ttl, owner), nil, nil
	case 2:
		return newLease(s, key, r.Token, uint64(r.N), start, ttl, owner), nil, nil
	case 0:
		ttl := time.Duration(r.N) * time.Millisecond
		if r.N < 0 {
			ttl = -1
		}
		return nil, &lock.HeldError{Key: key, TTL: ttl}, nil
	default:
		return nil, nil, errors.Join(lock.ErrNotAcquired, context.DeadlineExceeded)
	}
}

// isRedisReply reports whether err is an error reply from the server: the
// request arrived and failed as a whole, so there is nothing to undo.
func isRedisReply(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
}

// leaseEnded forgets l as its key's holder and lets the next local waiter
// compete. The caller must not hold s.mu.
func (s *Store) leaseEnded(l *lease) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ls := s.keys[l.key]; ls != nil && ls.holder == l {
		ls.holder = nil
		ls.handOffs = 0
		s.promoteLocked(l.key, ls)
	}
}

// handedOff reports a local hand-over received by a waiter.
func (s *Store) handedOff(ctx context.Context, e event) {
	observe.Record(ctx, s.opts.observer, observe.Event{
		Op: observe.LockHandOff, Driver: driverName, Key: e.lease.key, Outcome: observe.Local,
		Fence: e.lease.fence, Duration: time.Since(e.freed),
	})
}

// handOver passes l's key to the next local waiter in one round trip, when
// there is one and the hand-over budget allows. It reports whether it took
// care of l's release, and the error for Release to return.
func (s *Store) handOver(ctx context.Context, l *lease) (bool, error) {
	s.mu.Lock()
	ls := s.keys[l.key]
	if ls == nil || ls.holder != l || ls.handing || ls.queue.Len() == 0 || ls.handOffs >= s.opts.maxHandOffs {
		s.mu.Unlock()
		return false, nil
	}
	w := ls.queue.Remove(ls.queue.Front()).(*waiter)
	w.elem = nil
	ls.handing = true
	s.mu.Unlock()

	start := time.Now()
	res, err := redislua.Transfer.Run(ctx, s.client, []string{s.lockKey(l.key), s.fenceKey(l.key), s.names.Owner(l.key)},
		l.token, w.token, w.ttl.Milliseconds(), w.owner).Int64Slice()
	if err == nil && len(res) != 2 {
		err = fmt.Errorf("unexpected script reply %v", res)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	ls.handing = false
	switch {
	case err == nil && res[0] == 2:
		// One of an owner's holds given back; the owner still holds the
		// key. The waiter competes in Redis and waits for the last hold.
		if ls.holder == l {
			ls.holder = nil
		}
		l.finishLocked(released)
		ls.competitors++
		w.ev <- event{}
		return true, nil
	case err == nil && res[0] == 1:
		next := newLease(s, l.key, w.token, uint64(res[1]), start, w.ttl, w.owner)
		ls.holder = next
		ls.handOffs++
		l.finishLocked(released)
		w.ev <- event{lease: next, freed: start}
		return true, nil
	case err == nil: // our token no longer held the key
		if ls.holder == l {
			ls.holder = nil
		}
		ls.handOffs = 0
		l.finishLocked(lost)
		ls.competitors++
		w.ev <- event{} // the waiter competes in Redis
		return true, fmt.Errorf("redisstore: release %q: %w", l.key, lock.ErrLockLost)
	default:
		// The key's state is unknown: l may still hold it, so the caller
		// may retry Release; the waiter competes in Redis meanwhile.
		ls.competitors++
		w.ev <- event{}
		return true, fmt.Errorf("redisstore: release %q: %w", l.key, err)
	}
}

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
	owner string // the lock.WithOwner identity it was taken with, or ""
	done  chan struct{}

	mu       sync.Mutex
	state    leaseState
	deadline time.Time   // start of the last successful acquire/refresh + its TTL
	timer    *time.Timer // fires at deadline
}

func newLease(s *Store, key, tok string, fence uint64, start time.Time, ttl time.Duration, owner string) *lease {
	l := &lease{s: s, key: key, token: tok, fence: fence, owner: owner, done: make(chan struct{}), deadline: start.Add(ttl)}
	l.mu.Lock() // the timer may fire before AfterFunc returns
	defer l.mu.Unlock()
	l.timer = time.AfterFunc(time.Until(l.deadline), l.expire)
	return l
}

func (l *lease) Key() string           { return l.key }
func (l *lease) Token() string         { return l.token }
func (l *lease) Fence() uint64         { return l.fence }
func (l *lease) Done() <-chan struct{} { return l.done }

func (l *lease) remaining() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return max(0, time.Until(l.deadline))
}

// expire runs at the local deadline: with no successful refresh the lease
// is no longer ours (the deadline counts from before the request was sent,
// so it never passes after the server's own expiry).
func (l *lease) expire() {
	l.mu.Lock()
	if l.state != held {
		l.mu.Unlock()
		return
	}
	if d := time.Until(l.deadline); d > 0 {
		l.timer.Reset(d)
		l.mu.Unlock()
		return
	}
	l.mu.Unlock()
	l.finish(lost)
}

// finish ends the lease and tells the Store. The caller must hold neither
// s.mu nor l.mu.
func (l *lease) finish(st leaseState) {
	if l.finishLocked(st) {
		l.s.leaseEnded(l)
	}
}

// finishLocked ends the lease; it reports whether this call ended it. It
// takes l.mu, so a caller may hold s.mu (lock order: s.mu, then l.mu).
func (l *lease) finishLocked(st leaseState) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state != held {
		if l.state == lost && st == released {
			// The local deadline passed but the key was still ours and is
			// now let go, which is what the caller asked for.
			l.state = released
		}
		return false
	}
	l.state = st
	l.timer.Stop()
	close(l.done)
	return true
}

func (l *lease) currentState() leaseState {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.state
}

// Refresh extends the lease in one round trip.
func (l *lease) Refresh(ctx context.Context, ttl time.Duration) error {
	if err := lock.ValidateTTL(ttl); err != nil {
		return err
	}
	if l.currentState() != held {
		return fmt.Errorf("redisstore: refresh %q: %w", l.key, lock.ErrLockLost)
	}
	start := time.Now()
	ok, err := redislua.Run(ctx, &l.s.bg, l.s.client, redislua.Refresh, []string{l.s.lockKey(l.key), l.s.names.Owner(l.key)}, nil,
		l.token, ttl.Milliseconds()).Int64()
	if err != nil {
		return fmt.Errorf("redisstore: refresh %q: %w", l.key, err)
	}
	if ok == 0 {
		l.finish(lost)
		return fmt.Errorf("redisstore: refresh %q: %w", l.key, lock.ErrLockLost)
	}
	l.mu.Lock()
	if l.state != held {
		l.mu.Unlock()
		// The local deadline passed while the refresh was in flight: the
		// lease was already reported lost, so give the key back.
		cctx, cancel := lock.CleanupContext(ctx)
		defer cancel()
		_ = redislua.Release.Run(cctx, l.s.client, l.s.releaseKeys(l.key), l.token, l.s.channel(l.key), l.s.modeArg(), l.s.wakeGrace()).Err()
		return fmt.Errorf("redisstore: refresh %q: %w", l.key, lock.ErrLockLost)
	}
	l.deadline = start.Add(ttl)
	l.timer.Reset(time.Until(l.deadline))
	l.mu.Unlock()
	return nil
}

// Release deletes the lease and publishes the release message in one round
// trip, or hands the key to the next waiter of this Store in one round
// trip. With a cancelled ctx it still runs, under lock.ReleaseTimeout.
func (l *lease) Release(ctx context.Context) error {
	if l.currentState() == released {
		return nil
	}
	if ctx.Err() != nil {
		var cancel context.CancelFunc
		ctx, cancel = lock.CleanupContext(ctx)
		defer cancel()
	}
	if done, err := l.s.handOver(ctx, l); done {
		return err
	}
	ok, err := redislua.Run(ctx, &l.s.bg, l.s.client, redislua.Release, l.s.releaseKeys(l.key), nil,
		l.token, l.s.channel(l.key), l.s.modeArg(), l.s.wakeGrace()).Int64()
	if err != nil {
		return fmt.Errorf("redisstore: release %q: %w", l.key, err)
	}
	if ok == 0 {
		l.finish(lost)
		if l.currentState() == released { // a concurrent Release won
			return nil
		}
		return fmt.Errorf("redisstore: release %q: %w", l.key, lock.ErrLockLost)
	}
	l.finish(released)
	l.s.leaseEnded(l) // also when the local deadline had already ended it
	return nil
}

var (
	_ lock.Locker = (*Store)(nil)
	_ lock.Lease  = (*lease)(nil)
)
