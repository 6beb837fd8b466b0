package zkstore

import (
	"context"
	"errors"
	"fmt"
	"log"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/oncekit/oncekit/core/lock/lockdriver"
	"github.com/oncekit/oncekit/core/observe"

	"github.com/oncekit/oncekit/storage/internal/bg"
)

// Store is a lock.Locker, an idemdriver.Store and an inspector (lockdriver.Inspector,
// idemdriver.Inspector) over one ZooKeeper ensemble, through one session. It is
// safe for concurrent use; Close ends the session, and with it every lease
// of the Store.
type Store struct {
	conn     *zk.Conn
	timeout  time.Duration // the session timeout asked for
	root     string
	observer observe.Observer
	bg       bg.Group

	mu       sync.Mutex
	leases   map[*lease]struct{} // live leases, ended when the session may be lost
	orphans  []orphan            // nodes no lease uses any more, to delete (forget)
	sweeping bool                // a sweep of orphans runs
	gen      int64               // disconnections so far: a lease is granted only in the generation its node was made in
	closed   bool

	connected chan struct{} // closed at the first session
	closing   chan struct{} // closed by Close
	connOnce  sync.Once

	versions versionCache // of the records of the claims it holds

	cleanupStop chan struct{}
	cleanupDone chan struct{}

	// answered is when the ensemble last answered a request (Unix ns):
	// the liveness clock (liveness.go).
	answered     atomic.Int64
	livenessDone chan struct{}
	ping         atomic.Pointer[pingFunc] // the liveness request: conn.Exists (tests stall it)
}

const driverName = "zookeeper"

// DriverName implements observe.Source.
func (s *Store) DriverName() string { return driverName }

// Observer implements observe.Source: the Observer of WithObserver.
func (s *Store) Observer() observe.Observer { return s.observer }

// Connect opens a session with the ensemble at servers ("host:port") and
// returns a Store over it, once the session is established (or ctx ends).
func Connect(ctx context.Context, servers []string, opts ...Option) (*Store, error) {
	o := defaultOptions()
	for _, opt := range opts {
		opt(&o)
	}
	if err := o.validate(); err != nil {
		return nil, fmt.Errorf("zkstore: connect: %w", err)
	}
	if len(servers) == 0 {
		return nil, errors.New("zkstore: connect: no servers")
	}
	s := &Store{
		timeout:   o.sessionTimeout,
		root:      o.root,
		observer:  o.observer,
		leases:    make(map[*lease]struct{}),
		connected: make(chan struct{}),
		closing:   make(chan struct{}),
	}
	logger := o.logger
	if logger == nil {
		logger = quietLogger{}
	}
	conn, _, err := zk.Connect(servers, o.sessionTimeout, zk.WithEventCallback(s.onEvent), zk.WithLogger(logger),
		zk.WithLogInfo(false))
	if err != nil {
		return nil, fmt.Errorf("zkstore: connect: %w", err)
	}
	s.conn = conn
	ping := pingFunc(conn.Exists)
	s.ping.Store(&ping)
	select {
	case <-s.connected:
	case <-ctx.Done():
		conn.Close()
		return nil, fmt.Errorf("zkstore: connect to %s: %w", strings.Join(servers, ","), ctx.Err())
	}
	if err := s.ensure(ctx, s.lockRoot(), s.recordRoot()); err != nil {
		conn.Close()
		return nil, fmt.Errorf("zkstore: connect: %w", err)
	}
	if o.cleanup > 0 {
		s.startCleanup(o.cleanup)
	}
	s.startLiveness()
	return s, nil
}

// Conn is the Store's ZooKeeper connection, for the caller's own requests.
func (s *Store) Conn() *zk.Conn { return s.conn }

// SessionTimeout is the session timeout the Store asked the ensemble for.
// The servers keep it within 2 and 20 of their ticks (tickTime).
func (s *Store) SessionTimeout() time.Duration { return s.timeout }

// Close ends the Store's leases, stops its cleanup and closes the session:
// the servers delete the Store's lock nodes at once.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.closing)
	s.mu.Unlock()
	s.stopCleanup()
	<-s.livenessDone
	s.endAll()
	s.conn.Close()
	s.bg.Wait()
	return nil
}

// onEvent follows the session. While the client is disconnected the
// servers may expire the session at any moment and give its keys to
// others, so every lease ends at once (Curator's standard policy for
// SUSPENDED): Done closes, and a lease is never reported held after that.
// If the session survives, the nodes of those leases are deleted on
// reconnection; if it expired, the servers deleted them.
func (s *Store) onEvent(ev zk.Event) {
	if ev.Type != zk.EventSession {
		return
	}
	switch ev.State {
	case zk.StateHasSession:
		s.noteAnswer()
		s.connOnce.Do(func() { close(s.connected) })
		s.sweep()
	case zk.StateDisconnected, zk.StateExpired:
		s.endAll()
	}
}

// orphan is a node no lease of the Store uses any more: by its path, or,
// when the reply to its creation was lost, by the token in its name under
// dir (Curator's protected mode).
type orphan struct{ path, dir, tok string }

// forget queues node, which no lease of the Store uses any more, for
// deletion: at once, and again whenever the session is back, until the
// servers confirm it is gone. A node left behind would keep its key held
// for as long as the session lives.
func (s *Store) forget(node string) { s.forgetOrphan(orphan{path: node}) }

// forgetCreated is forget for the node of token tok under dir whose
// creation may have succeeded without an answer.
func (s *Store) forgetCreated(dir, tok string) { s.forgetOrphan(orphan{dir: dir, tok: tok}) }

func (s *Store) forgetOrphan(o orphan) {
	s.mu.Lock()
	if !s.closed {
		s.orphans = append(s.orphans, o)
	}
	s.mu.Unlock()
	s.sweep()
}

// remove deletes o; it reports false when it must be tried again.
func (s *Store) remove(o orphan) bool {
	gone := func(err error) bool {
		return err == nil || errors.Is(err, zk.ErrNoNode) || errors.Is(err, zk.ErrSessionExpired) || errors.Is(err, zk.ErrClosing)
	}
	ctx := context.Background() // bounded by call
	del := func(p string) error {
		_, err := call(ctx, s, func() (struct{}, error) { return struct{}{}, s.conn.Delete(p, -1) }, nil)
		return err
	}
	if o.path != "" {
		return gone(del(o.path))
	}
	kids, err := call(ctx, s, func() ([]string, error) {
		kids, _, err := s.conn.Children(o.dir)
		return kids, err
	}, nil)
	if err != nil {
		return gone(err)
	}
	for _, k := range kids {
		if strings.HasPrefix(k, o.tok+"-") && !gone(del(o.dir+"/"+k)) {
			return false
		}
	}
	return true
}

// sweep deletes the queued nodes in the background (one sweep at a time);
// those it cannot delete now stay queued.
func (s *Store) sweep() {
	s.mu.Lock()
	if s.sweeping || len(s.orphans) == 0 || s.closed {
		s.mu.Unlock()
		return
	}
	s.sweeping = true
	s.mu.Unlock()
	s.bg.Go(func() {
		for {
			s.mu.Lock()
			nodes := s.orphans
			s.orphans = nil
			if len(nodes) == 0 || s.closed {
				s.sweeping = false
				s.mu.Unlock()
				return
			}
			s.mu.Unlock()
			var left []orphan
			for _, o := range nodes {
				if !s.remove(o) {
					left = append(left, o)
				}
			}
			if len(left) > 0 {
				s.mu.Lock()
				s.orphans = append(s.orphans, left...)
				s.mu.Unlock()
				// Again soon: the session may be back without an event
				// this sweep saw.
				select {
				case <-time.After(s.timeout / 4):
				case <-s.closing:
				}
			}
		}
	})
}

// endAll ends every live lease as lost, keeping their nodes to delete once
// the session is back.
func (s *Store) endAll() {
	s.mu.Lock()
	s.gen++
	ended := make([]*lease, 0, len(s.leases))
	for l := range s.leases {
		ended = append(ended, l)
	}
	s.mu.Unlock()
	for _, l := range ended {
		l.cut.Store(true)
		if l.End(lostState) {
			s.mu.Lock()
			if !s.closed {
				s.orphans = append(s.orphans, orphan{path: l.node})
			}
			s.mu.Unlock()
		}
	}
	// Swept when the session is back (StateHasSession), not now: the
	// client is cut off.
}

// call runs f, a blocking request of the ZooKeeper client, and returns its
// result or ctx's error once ctx ends.
//
// undo, if set, undoes what a request ctx gave up on did (the node of a
// create): the call then waits for the answer within the clean-up bound of
// ctx (lockdriver.CleanupContext) and runs undo before it returns, so that a
// cancelled Acquire leaves nothing behind once it has returned. An answer
// that does not come within that bound is undone in the background when it
// comes. Without undo, the request goes on in the background and the call
// returns at once.
//
// A request is also given up after twice the session timeout (the client
// can hold a request across a reconnection; by then the session is over
// anyway), with ErrRequestTimeout.
func call[T any](ctx context.Context, s *Store, f func() (T, error), undo func(T, error)) (T, error) {
	var zero T
	if err := ctx.Err(); err != nil {
		return zero, err
	}
	type result struct {
		v   T
		err error
	}
	ch := make(chan result, 1)
	s.bg.Go(func() {
		v, err := f()
		ch <- result{v, err}
	})
	t := time.NewTimer(2 * s.timeout)
	defer t.Stop()
	var err error
	select {
	case r := <-ch:
		if answerErr(r.err) {
			s.noteAnswer()
		}
		return r.v, r.err
	case <-ctx.Done():
		err = ctx.Err()
	case <-t.C:
		err = ErrRequestTimeout
	}
	if undo == nil {
		return zero, err
	}
	if err != ErrRequestTimeout {
		cctx, cancel := lockdriver.CleanupContext(ctx)
		defer cancel()
		select {
		case r := <-ch:
			undo(r.v, r.err)
			return zero, err
		case <-cctx.Done():
		case <-t.C:
		}
	}
	s.bg.Go(func() {
		r := <-ch
		undo(r.v, r.err)
	})
	return zero, err
}

// ErrRequestTimeout reports a request the ensemble did not answer within
// twice the session timeout.
var ErrRequestTimeout = errors.New("zkstore: no answer within twice the session timeout")

// get reads a node's data and Stat.
func (s *Store) get(ctx context.Context, path string) ([]byte, *zk.Stat, error) {
	type res struct {
		data []byte
		st   *zk.Stat
	}
	r, err := call(ctx, s, func() (res, error) {
		d, st, err := s.conn.Get(path)
		return res{d, st}, err
	}, nil)
	return r.data, r.st, err
}

// ensure creates the persistent nodes paths (and their parents) where
// missing.
func (s *Store) ensure(ctx context.Context, paths ...string) error {
	for _, p := range paths {
		parts := strings.Split(strings.TrimPrefix(p, "/"), "/")
		for i := range parts {
			sub := "/" + strings.Join(parts[:i+1], "/")
			_, err := call(ctx, s, func() (string, error) { return s.conn.Create(sub, nil, 0, zk.WorldACL(zk.PermAll)) }, nil)
			if err != nil && !errors.Is(err, zk.ErrNodeExists) {
				return fmt.Errorf("create %s: %w", sub, err)
			}
		}
	}
	return nil
}

// serverClock is a reading of the ensemble's clock: the leader's, in Unix
// ms, and the epoch of that leader (a zxid's high 32 bits).
type serverClock struct{ ms, epoch int64 }

// epochOf is the leader epoch zxid was issued in.
func epochOf(zxid int64) int64 { return zxid >> 32 }

// serverNow is the ensemble's clock: the modification time of a write the
// call makes to "<root>/clock", stamped by the leader, and its epoch.
// Record expiries are judged by it, never by this process's clock, and
// only against times the same leader stamped (judge).
func (s *Store) serverNow(ctx context.Context) (serverClock, error) {
	p := s.root + "/clock"
	st, err := call(ctx, s, func() (*zk.Stat, error) { return s.conn.Set(p, nil, -1) }, nil)
	if errors.Is(err, zk.ErrNoNode) {
		if _, err := call(ctx, s, func() (string, error) { return s.conn.Create(p, nil, 0, zk.WorldACL(zk.PermAll)) }, nil); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return serverClock{}, err
		}
		st, err = call(ctx, s, func() (*zk.Stat, error) { return s.conn.Set(p, nil, -1) }, nil)
	}
	if err != nil {
		return serverClock{}, err
	}
	return serverClock{ms: st.Mtime, epoch: epochOf(st.Mzxid)}, nil
}

func (s *Store) lockRoot() string   { return s.root + "/lock" }
func (s *Store) recordRoot() string { return s.root + "/idem" }

// lockDir is the container node under which key's acquisitions queue.
func (s *Store) lockDir(key string) string { return s.lockRoot() + "/" + escape(key) }

// recordPath is key's record. Records are spread over 256 directories,
// so that no directory's listing outgrows a ZooKeeper packet.
func (s *Store) recordPath(key string) string {
	return s.recordRoot() + "/" + bucket(key) + "/" + escape(key)
}

// escape makes key one znode name: letters, digits and "-_.:@=+~," stay,
// every other byte is %XX; "." and ".." (reserved names) are escaped too.
func escape(key string) string {
	var b strings.Builder
	for i := 0; i < len(key); i++ {
		c := key[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("-_.:@=+~,", c) >= 0 {
			b.WriteByte(c)
			continue
		}
		fmt.Fprintf(&b, "%%%02X", c)
	}
	if e := b.String(); e != "." && e != ".." {
		return e
	}
	return strings.ReplaceAll(key, ".", "%2E")
}

// unescape reverses escape.
func unescape(name string) (string, bool) {
	var b strings.Builder
	for i := 0; i < len(name); i++ {
		if name[i] != '%' {
			b.WriteByte(name[i])
			continue
		}
		if i+2 >= len(name) {
			return "", false
		}
		var c byte
		if _, err := fmt.Sscanf(name[i+1:i+3], "%02X", &c); err != nil {
			return "", false
		}
		b.WriteByte(c)
		i += 2
	}
	return b.String(), true
}

// bucket is key's record directory: two hex digits of an FNV-1a hash.
func bucket(key string) string {
	h := uint32(2166136261)
	for i := 0; i < len(key); i++ {
		h ^= uint32(key[i])
		h *= 16777619
	}
	return fmt.Sprintf("%02x", h&0xff)
}

// quietLogger drops the client's log lines: connection errors surface as
// errors of the calls, and session changes end leases.
type quietLogger struct{}

func (quietLogger) Printf(string, ...any) {}

// StdLogger logs the ZooKeeper client's lines through the standard log
// package (see WithLogger).
var StdLogger zk.Logger = log.Default()

// Ping is a health check for readiness probes: the session is up and the
// ensemble answers a read of the root.
func (s *Store) Ping(ctx context.Context) error {
	if _, err := call(ctx, s, func() (bool, error) {
		ok, _, err := s.conn.Exists(s.root)
		return ok, err
	}, nil); err != nil {
		return fmt.Errorf("zkstore: ping: %w", err)
	}
	return nil
}
