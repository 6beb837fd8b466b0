package redisnotify

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Client is what a Subscriber needs of go-redis.
type Client interface {
	Subscribe(ctx context.Context, channels ...string) *redis.PubSub
	SSubscribe(ctx context.Context, channels ...string) *redis.PubSub
	Info(ctx context.Context, section ...string) *redis.StringCmd
}

// Mode selects how a release is announced.
type Mode int

const (
	// Auto uses sharded pub/sub (SPUBLISH/SSUBSCRIBE) on Redis 7 and later,
	// classic pub/sub before.
	Auto Mode = iota
	// Sharded always uses SPUBLISH/SSUBSCRIBE (Redis ≥ 7).
	Sharded
	// Classic always uses PUBLISH/SUBSCRIBE.
	Classic
	// Off publishes nothing; waiters wait for the holder's remaining TTL or
	// a recheck interval.
	Off
)

func (m Mode) String() string {
	switch m {
	case Auto:
		return "auto"
	case Sharded:
		return "sharded"
	case Classic:
		return "classic"
	case Off:
		return "off"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Valid reports whether m is one of the modes above.
func (m Mode) Valid() bool { return m >= Auto && m <= Off }

// ScriptArg is the mode argument of the release script.
func (m Mode) ScriptArg() string {
	switch m {
	case Sharded:
		return "s"
	case Classic:
		return "c"
	case Off:
		return "n"
	}
	return "a"
}

// Subscriber multiplexes the release channels of all waiting Acquires of one
// Store over a single pub/sub connection (one per shard under Redis
// Cluster, where a shard channel can only be subscribed on its own shard).
// A channel is subscribed while at least one waiter watches it; a message
// wakes every waiter of the channel, and the Store's local queue keeps that
// to one waiter per key.
type Subscriber struct {
	client Client
	mode   Mode

	io sync.Mutex // orders SUBSCRIBE and UNSUBSCRIBE requests; taken before mu

	mu       sync.Mutex
	sharded  bool // resolved mode, valid once resolved is true
	resolved bool
	conns    map[string]*psConn // by shard ("" outside Cluster)
	chans    map[string]*channel
	closed   chan struct{}
	isClosed bool
	onOrphan func(channel, payload string)
}

// psConn is one pub/sub connection and the goroutine reading it.
type psConn struct {
	ps     *redis.PubSub
	cancel context.CancelFunc
	done   chan struct{}
}

type channel struct {
	conn     *psConn
	watchers map[*Watcher]struct{}
	ready    chan struct{} // closed when the server confirmed the subscription
	isReady  bool
	idle     *time.Timer // set while nobody watches: the unsubscribe to come
}

// subscribeClient is what a pub/sub connection is opened on.
type subscribeClient interface {
	Subscribe(ctx context.Context, channels ...string) *redis.PubSub
	SSubscribe(ctx context.Context, channels ...string) *redis.PubSub
}

// shardOf returns the client to subscribe name on and the shard's identity.
// Outside Cluster every channel lives on the one client.
func (s *Subscriber) shardOf(ctx context.Context, name string, sharded bool) (subscribeClient, string, error) {
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

// Watcher is one waiting Acquire's interest in one channel.
type Watcher struct {
	name string
	ch   *channel // nil when not subscribed (pub/sub off or failed)
	wake chan struct{}

	mu     sync.Mutex
	grants []string // grant messages not yet taken
}

// Wake receives a value when a release message arrives on the channel, or
// when messages may have been lost (a reconnect).
func (w *Watcher) Wake() <-chan struct{} { return w.wake }

// GrantPrefix starts a message that grants the key to a waiter (see
// rediskit's release.lua): "g|<token>|<fence>".
const GrantPrefix = "g|"

// Grants returns the grant messages received since the last call: every
// one is kept until taken, since the key a grant names is held for its
// receiver.
func (w *Watcher) Grants() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	g := w.grants
	w.grants = nil
	return g
}

// Subscribed reports whether the server confirmed the subscription; until
// it does, a waiter must poll.
func (w *Watcher) Subscribed() bool {
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

// New returns a Subscriber that opens its connections on c lazily.
func New(c Client, mode Mode) *Subscriber {
	return &Subscriber{
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

// Closed is closed by Close.
func (s *Subscriber) Closed() <-chan struct{} { return s.closed }

// ErrClosed reports a Watch after Close.
var ErrClosed = errors.New("redisnotify: subscriber closed")

// Watch registers a waiter on channel name and returns once the
// subscription is confirmed, or could not be made (then the waiter polls).
// It fails only when ctx ends (ctx.Err()) or after Close (ErrClosed).
// Network requests are made without s.mu held, so that messages keep
// flowing to other waiters meanwhile.
func (s *Subscriber) Watch(ctx context.Context, name string) (*Watcher, error) {
	w := &Watcher{name: name, wake: make(chan struct{}, 1)}
	if s.mode == Off {
		return w, nil
	}
	sharded, err := s.resolve(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return w, nil // cannot tell the server's version: poll
	}
	sc, shard, err := s.shardOf(ctx, name, sharded)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return w, nil // cannot tell the shard: poll
	}
	s.mu.Lock()
	if s.isClosed {
		s.mu.Unlock()
		return nil, ErrClosed
	}
	ch := s.chans[name]
	fresh := ch == nil
	if ch != nil && ch.idle != nil {
		ch.idle.Stop() // watched again within its linger: still subscribed
		ch.idle = nil
	}
	if fresh {
		conn := s.conns[shard]
		if conn == nil {
			conn = s.startLocked(shard, sc, sharded) // no request yet
		}
		ch = &channel{conn: conn, watchers: make(map[*Watcher]struct{}), ready: make(chan struct{})}
		s.chans[name] = ch
	}
	ch.watchers[w] = struct{}{}
	w.ch = ch
	s.mu.Unlock()

	if fresh {
		s.io.Lock()
		if sharded {
			err = ch.conn.ps.SSubscribe(ctx, name)
		} else {
			err = ch.conn.ps.Subscribe(ctx, name)
		}
		s.io.Unlock()
		if err != nil && ctx.Err() == nil {
			return w, nil // the connection is down: poll until it is back
		}
	}
	t := time.NewTimer(subscribeWait)
	defer t.Stop()
	select {
	case <-ch.ready:
	case <-t.C:
	case <-s.closed:
	case <-ctx.Done():
		s.Unwatch(w)
		return nil, ctx.Err()
	}
	return w, nil
}

// Linger is how long a channel stays subscribed after its last waiter
// left: a process that waits for a key again and again (a hot key taken in
// turns by several processes) subscribes to it once, not once per wait —
// one command and one round trip less per wait on every node. A grant that
// arrives meanwhile finds no waiter and goes to OnOrphanGrant's function,
// as one arriving just after an unsubscribe always did.
const Linger = time.Second

// Unwatch removes a waiter; Linger after the last one left, the channel is
// unsubscribed (unless a new waiter watches it again meanwhile).
func (s *Subscriber) Unwatch(w *Watcher) {
	if w.ch == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(w.ch.watchers, w)
	if len(w.ch.watchers) > 0 || s.chans[w.name] != w.ch || s.isClosed || w.ch.idle != nil {
		return
	}
	ch := w.ch
	ch.idle = time.AfterFunc(Linger, func() { s.unsubscribe(w.name, ch) })
}

// unsubscribe ends channel name's subscription ch if nobody watched it
// again since its linger began.
func (s *Subscriber) unsubscribe(name string, ch *channel) {
	s.io.Lock()
	defer s.io.Unlock()
	s.mu.Lock()
	if s.chans[name] != ch || len(ch.watchers) > 0 || ch.idle == nil || s.isClosed {
		s.mu.Unlock()
		return
	}
	delete(s.chans, name)
	sharded := s.sharded
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), subscribeWait)
	defer cancel()
	if sharded {
		_ = ch.conn.ps.SUnsubscribe(ctx, name)
	} else {
		_ = ch.conn.ps.Unsubscribe(ctx, name)
	}
}

// resolve decides once between sharded and classic pub/sub.
func (s *Subscriber) resolve(ctx context.Context) (bool, error) {
	s.mu.Lock()
	if s.resolved {
		defer s.mu.Unlock()
		return s.sharded, nil
	}
	s.mu.Unlock()
	var sharded bool
	switch s.mode {
	case Sharded:
		sharded = true
	case Classic:
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

// startLocked opens shard's pub/sub connection object and its reading
// loop. go-redis connects lazily: nothing is sent here.
func (s *Subscriber) startLocked(shard string, sc subscribeClient, sharded bool) *psConn {
	var ps *redis.PubSub
	if sharded {
		ps = sc.SSubscribe(context.Background())
	} else {
		ps = sc.Subscribe(context.Background())
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &psConn{ps: ps, cancel: cancel, done: make(chan struct{})}
	s.conns[shard] = c
	go s.loop(ctx, ps, c.done)
	return c
}

// pingEvery is how long the connection may stay silent before the loop
// checks it with a PING.
const pingEvery = 30 * time.Second

func (s *Subscriber) loop(ctx context.Context, ps *redis.PubSub, done chan struct{}) {
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
			s.wakeChannel(m.Channel, m.Payload)
		}
	}
}

func isTimeout(err error) bool {
	var te interface{ Timeout() bool }
	return errors.As(err, &te) && te.Timeout()
}

func (s *Subscriber) confirm(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ch := s.chans[name]; ch != nil && !ch.isReady {
		ch.isReady = true
		close(ch.ready)
	}
}

func (s *Subscriber) wakeChannel(name, payload string) {
	grant := strings.HasPrefix(payload, GrantPrefix)
	s.mu.Lock()
	ch := s.chans[name]
	orphan := grant && (ch == nil || len(ch.watchers) == 0)
	if ch != nil {
		for w := range ch.watchers {
			if grant {
				w.mu.Lock()
				w.grants = append(w.grants, payload)
				w.mu.Unlock()
			}
			notify(w)
		}
	}
	onOrphan := s.onOrphan
	s.mu.Unlock()
	if orphan && onOrphan != nil {
		onOrphan(name, payload)
	}
}

// OnOrphanGrant sets f to receive the grants that arrive on a channel
// nobody watches any more (its waiter left while the grant was on its
// way): the key is held for a token nobody will use, and f must give it
// back. f runs on the connection's reading goroutine: it must not block.
func (s *Subscriber) OnOrphanGrant(f func(channel, payload string)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onOrphan = f
}

func (s *Subscriber) wakeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ch := range s.chans {
		for w := range ch.watchers {
			notify(w)
		}
	}
}

func notify(w *Watcher) {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// Close closes the pub/sub connections and Closed; later Watch calls fail
// with ErrClosed.
func (s *Subscriber) Close() error {
	s.mu.Lock()
	if s.isClosed {
		s.mu.Unlock()
		return nil
	}
	s.isClosed = true
	close(s.closed)
	for _, ch := range s.chans {
		if ch.idle != nil {
			ch.idle.Stop()
		}
	}
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
