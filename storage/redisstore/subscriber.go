package redisstore

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/core/lock"
)

// subscriber multiplexes the release channels of all waiting Acquires of one
// Store over a single pub/sub connection (one per shard under Redis
// Cluster, where a shard channel can only be subscribed on its own shard).
// A channel is subscribed while at least one waiter watches it; a message
// wakes every waiter of the channel, and the Store's local queue keeps that
// to one waiter per key.
type subscriber struct {
	client Client
	mode   PubSubMode

	mu       sync.Mutex
	sharded  bool // resolved mode, valid once resolved is true
	resolved bool
	conns    map[string]*psConn // by shard ("" outside Cluster)
	chans    map[string]*channel
	closed   chan struct{}
	isClosed bool
}

// psConn is one pub/sub connection and the goroutine reading it.
type psConn struct {
	ps     *redis.PubSub
	cancel context.CancelFunc
	done   chan struct{}
}

type channel struct {
	conn     *psConn
	watchers map[*watcher]struct{}
	ready    chan struct{} // closed when the server confirmed the subscription
	isReady  bool
}

// subscribeClient is what a pub/sub connection is opened on.
type subscribeClient interface {
	Subscribe(ctx context.Context, channels ...string) *redis.PubSub
	SSubscribe(ctx context.Context, channels ...string) *redis.PubSub
}

// shardOf returns the client to subscribe name on and the shard's identity.
// Outside Cluster every channel lives on the one client.
func (s *subscriber) shardOf(ctx context.Context, name string, sharded bool) (subscribeClient, string, error) {
	cc, ok := s.client.(*redis.ClusterClient)
	if !ok {
		return s.client, "", nil
	}
	if !sharded {
		return s.client, "", nil // classic pub/sub is cluster-wide
	}
	node, err := cc.MasterForKey(ctx, name)
	if err != nil {
		return nil, "", err
	}
	return node, node.Options().Addr, nil
}

// watcher is one waiting Acquire.
type watcher struct {
	name   string
	ch     *channel // nil when not subscribed (pub/sub off or failed)
	wake   chan struct{}
	closed <-chan struct{}
}

func (w *watcher) subscribed() bool {
	if w.ch == nil {
		return false
	}
	select {
	case <-w.ch.ready:
		return true
	default:
		return false
	}
}

func newSubscriber(c Client, mode PubSubMode) *subscriber {
	return &subscriber{
		client: c,
		mode:   mode,
		chans:  make(map[string]*channel),
		conns:  make(map[string]*psConn),
		closed: make(chan struct{}),
	}
}

// subscribeWait bounds how long a waiter waits for the server to confirm a
// subscription before it falls back to backoff.
const subscribeWait = time.Second

// watch registers a waiter on name and returns once the subscription is
// confirmed (or could not be made, in which case the waiter polls).
func (s *subscriber) watch(ctx context.Context, name string) (*watcher, error) {
	w := &watcher{name: name, wake: make(chan struct{}, 1), closed: s.closed}
	if s.mode == PubSubOff {
		return w, nil
	}
	sharded, err := s.resolve(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil, errors.Join(lock.ErrNotAcquired, ctx.Err())
		}
		return w, nil // cannot tell the server's version: poll
	}
	sc, shard, err := s.shardOf(ctx, name, sharded)
	if err != nil {
		if ctx.Err() != nil {
			return nil, errors.Join(lock.ErrNotAcquired, ctx.Err())
		}
		return w, nil // cannot tell the shard: poll
	}
	s.mu.Lock()
	if s.isClosed {
		s.mu.Unlock()
		return nil, lock.ErrClosed
	}
	ch := s.chans[name]
	if ch == nil {
		ch = &channel{watchers: make(map[*watcher]struct{}), ready: make(chan struct{})}
		var err error
		conn := s.conns[shard]
		if conn == nil {
			var ps *redis.PubSub
			if sharded {
				ps = sc.SSubscribe(ctx, name)
			} else {
				ps = sc.Subscribe(ctx, name)
			}
			conn = s.startLocked(shard, ps)
		} else if sharded {
			err = conn.ps.SSubscribe(ctx, name)
		} else {
			err = conn.ps.Subscribe(ctx, name)
		}
		if err != nil {
			s.mu.Unlock()
			return w, nil // the connection is down: poll until it is back
		}
		ch.conn = conn
		s.chans[name] = ch
	}
	ch.watchers[w] = struct{}{}
	w.ch = ch
	s.mu.Unlock()

	t := time.NewTimer(subscribeWait)
	defer t.Stop()
	select {
	case <-ch.ready:
	case <-t.C:
	case <-s.closed:
	case <-ctx.Done():
		s.unwatch(w)
		return nil, errors.Join(lock.ErrNotAcquired, ctx.Err())
	}
	return w, nil
}

// unwatch removes a waiter; the last one out unsubscribes the channel.
func (s *subscriber) unwatch(w *watcher) {
	if w.ch == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(w.ch.watchers, w)
	if len(w.ch.watchers) > 0 || s.chans[w.name] != w.ch {
		return
	}
	delete(s.chans, w.name)
	if s.isClosed {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), subscribeWait)
	defer cancel()
	if s.sharded {
		_ = w.ch.conn.ps.SUnsubscribe(ctx, w.name)
	} else {
		_ = w.ch.conn.ps.Unsubscribe(ctx, w.name)
	}
}

// resolve decides once between sharded and classic pub/sub.
func (s *subscriber) resolve(ctx context.Context) (bool, error) {
	s.mu.Lock()
	if s.resolved {
		defer s.mu.Unlock()
		return s.sharded, nil
	}
	s.mu.Unlock()
	var sharded bool
	switch s.mode {
	case PubSubSharded:
		sharded = true
	case PubSubClassic:
		sharded = false
	default:
		info, err := s.client.Info(ctx, "server").Result()
		if err != nil {
			return false, err
		}
		sharded = majorVersion(info) >= 7
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.resolved {
		s.sharded, s.resolved = sharded, true
	}
	return s.sharded, nil
}

// majorVersion reads redis_version from INFO server output, or returns 0.
func majorVersion(info string) int {
	for line := range strings.Lines(info) {
		v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:")
		if !ok {
			continue
		}
		major, _, _ := strings.Cut(v, ".")
		n, _ := strconv.Atoi(major)
		return n
	}
	return 0
}

func (s *subscriber) startLocked(shard string, ps *redis.PubSub) *psConn {
	ctx, cancel := context.WithCancel(context.Background())
	c := &psConn{ps: ps, cancel: cancel, done: make(chan struct{})}
	s.conns[shard] = c
	go s.loop(ctx, ps, c.done)
	return c
}

// pingEvery is how long the connection may stay silent before the loop
// checks it with a PING.
const pingEvery = 30 * time.Second

func (s *subscriber) loop(ctx context.Context, ps *redis.PubSub, done chan struct{}) {
	defer close(done)
	for {
		msg, err := ps.ReceiveTimeout(ctx, pingEvery)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			// Timeout: check the connection. Anything else: the connection
			// broke and go-redis reconnects and resubscribes on the next
			// receive; messages may have been lost meanwhile, so every waiter
			// tries again.
			if isTimeout(err) {
				_ = ps.Ping(ctx)
				continue
			}
			s.wakeAll()
			select {
			case <-time.After(50 * time.Millisecond):
			case <-ctx.Done():
				return
			}
			continue
		}
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" || m.Kind == "ssubscribe" {
				s.confirm(m.Channel)
			}
		case *redis.Message:
			s.wakeChannel(m.Channel)
		}
	}
}

func isTimeout(err error) bool {
	var te interface{ Timeout() bool }
	return errors.As(err, &te) && te.Timeout()
}

func (s *subscriber) confirm(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ch := s.chans[name]; ch != nil && !ch.isReady {
		ch.isReady = true
		close(ch.ready)
	}
}

func (s *subscriber) wakeChannel(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ch := s.chans[name]; ch != nil {
		for w := range ch.watchers {
			notify(w)
		}
	}
}

func (s *subscriber) wakeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ch := range s.chans {
		for w := range ch.watchers {
			notify(w)
		}
	}
}

func notify(w *watcher) {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

func (s *subscriber) close() error {
	s.mu.Lock()
	if s.isClosed {
		s.mu.Unlock()
		return nil
	}
	s.isClosed = true
	close(s.closed)
	conns := s.conns
	s.conns = nil
	s.mu.Unlock()
	var errs []error
	for _, c := range conns {
		c.cancel()
		errs = append(errs, c.ps.Close())
		<-c.done
	}
	return errors.Join(errs...)
}
