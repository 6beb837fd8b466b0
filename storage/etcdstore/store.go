package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/lock/lockdriver"
	"github.com/oncekit/oncekit/core/observe"
	"github.com/oncekit/oncekit/storage/internal/bg"
	"github.com/oncekit/oncekit/storage/internal/keep"
)

// Client is the part of the etcd client the Store uses; *clientv3.Client
// satisfies it.
type Client interface {
	clientv3.KV
	clientv3.Lease
	clientv3.Watcher
}

// Store is a lock.Locker and an idemdriver.Store over etcd. It is safe for
// concurrent use. Its keys are bound to session leases, one per TTL class
// (the TTL rounded up to whole seconds), created on first use and kept
// alive in the background while the process runs; Close revokes them.
type Store struct {
	c    Client
	opts options

	mu       sync.Mutex
	sessions map[int64]*session // by TTL class, in seconds
	closed   bool
	stop     chan struct{} // closed by Close: background retries end

	qmu    sync.Mutex
	queues map[string]*queueWatch // by lock directory, while waiters use it
	beats  *beatWatch             // the sessions' heartbeats, while waiters use them

	rmu       sync.Mutex
	retention map[time.Time]clientv3.LeaseID // idem records' retention leases, by minute

	cmu    sync.Mutex
	claims map[string]*claimTimer // this Store's in-flight idem claims, by entry

	recent   keep.Recent        // when this Store last let each key go (lease.hot)
	handOffs keep.HandOffs      // how long a kept entry serves (kept.go)
	kept     keep.Holds[*lease] // entries kept after their Release (kept.go)

	bg bg.Group

	owned   func() error // closes the client storage.Open made (nil for New's)
	ownOnce sync.Once
}

// session is one etcd lease that keys are bound to: the keys of every
// lease and claim whose TTL rounds up to its class. A process that dies
// or is cut off loses them within that TTL, by the server's clock.
type session struct {
	id     clientv3.LeaseID
	ttl    time.Duration // its class's TTL, or the granted TTL when shorter (see session)
	done   chan struct{} // closed when the lease is lost, revoked or the Store closes
	cancel context.CancelFunc

	mu     sync.Mutex
	leases map[*lease]struct{}
	valid  time.Time // when the last acknowledged keep-alive was sent + ttl
}

// New returns a Store over c. It makes no request until first used.
func New(c Client, opts ...Option) (*Store, error) {
	if c == nil {
		return nil, errors.New("etcdstore: New: nil client")
	}
	o := defaultOptions()
	for _, opt := range opts {
		opt(&o)
	}
	if err := o.validate(); err != nil {
		return nil, fmt.Errorf("etcdstore: New: %w", err)
	}
	return &Store{c: c, opts: o, sessions: map[int64]*session{}, stop: make(chan struct{}),
		handOffs: keep.HandOffs{Max: o.maxHandOffs, Hold: o.maxHold}}, nil
}

const driverName = "etcd"

// DriverName implements observe.Source: "etcd".
func (s *Store) DriverName() string { return driverName }

// Observer implements observe.Source: the WithObserver option.
func (s *Store) Observer() observe.Observer { return s.opts.observer }

// Close revokes the session leases, which deletes every key of the Store
// at once (kept entries too, see WithLinger), ends its leases (Done
// closes), and waits for background work. It does not close a client
// given to New; a Store storage.Open made closes the client it opened.
func (s *Store) Close() error {
	s.kept.Close() // the revokes below delete the kept entries
	s.mu.Lock()
	if !s.closed {
		close(s.stop)
	}
	s.closed = true
	sessions := s.sessions
	s.sessions = map[int64]*session{}
	s.mu.Unlock()
	var errs []error
	for _, sess := range sessions {
		ctx, cancel := context.WithTimeout(context.Background(), lockdriver.ReleaseTimeout)
		if _, err := s.c.Revoke(ctx, sess.id); err != nil {
			errs = append(errs, fmt.Errorf("etcdstore: close: revoke session: %w", err))
		}
		cancel()
		sess.end()
	}
	s.closeQueues()
	s.closeBeats()
	s.stopClaimTimers()
	s.bg.Wait()
	if s.owned != nil {
		s.ownOnce.Do(func() { errs = append(errs, s.owned()) })
	}
	return errors.Join(errs...)
}

// Client returns the client the Store was made with (for a Store that
// storage.Open made, the *clientv3.Client it opened).
func (s *Store) Client() Client { return s.c }

// ttlClass is the session a lease of ttl is bound to: ttl rounded up to
// whole seconds (etcd leases count in seconds, and etcd raises very short
// ones to its own minimum, about 2 s with default settings).
func ttlClass(ttl time.Duration) int64 {
	return max(1, int64((ttl+time.Second-1)/time.Second))
}

// session returns the live session of ttl's class, creating one when there
// is none.
func (s *Store) session(ctx context.Context, ttl time.Duration) (*session, error) {
	class := ttlClass(ttl)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, lock.ErrClosed
	}
	if sess := s.sessions[class]; sess != nil {
		select {
		case <-sess.done:
			delete(s.sessions, class)
		default:
			return sess, nil
		}
	}
	sent := time.Now()
	g, err := s.c.Grant(ctx, class)
	if err != nil {
		return nil, fmt.Errorf("etcdstore: grant session lease: %w", err)
	}
	// The server may grant more than the class asked for: it raises every
	// lease to its minimum TTL, 1.5 election timeouts rounded up to whole
	// seconds (2 s under etcd's default 1 s election timeout). The session
	// counts only the class's TTL — its validity, its keep-alives and the
	// TTL its heartbeat announces — so that waiters free a dead holder's
	// keys a TTL after its last heartbeat, as the caller asked, not when
	// the server's longer lease runs out. (The server's lease only has to
	// outlive the session's own count, which it does.)
	granted := min(time.Duration(g.TTL)*time.Second, time.Duration(class)*time.Second)
	// The heartbeat goes first: no entry is bound to the session before
	// waiters can tell when it was last alive (see heartbeat.go).
	if err := s.beat(ctx, g.ID, granted); err != nil {
		s.bg.Go(func() {
			rctx, cancel := context.WithTimeout(context.Background(), lockdriver.ReleaseTimeout)
			defer cancel()
			_, _ = s.c.Revoke(rctx, g.ID)
		})
		return nil, fmt.Errorf("etcdstore: write session heartbeat: %w", err)
	}
	kctx, cancel := context.WithCancel(context.Background())
	sess := &session{id: g.ID, ttl: granted, done: make(chan struct{}), cancel: cancel,
		leases: map[*lease]struct{}{}}
	sess.valid = sent.Add(sess.ttl)
	s.bg.Go(func() { s.keepAlive(kctx, sess) })
	s.sessions[class] = sess
	return sess, nil
}

// keepAlive renews sess every third of its TTL until ctx ends or the lease
// is lost. The session's validity counts from when each keep-alive was
// sent, never from when its answer arrived: the server's expiry is at
// least that late, so the session — and every lease bound to it — ends
// here before anyone else can be granted its keys. A keep-alive counts
// only once the heartbeat written after it is stored too: waiters free a
// session's keys a TTL after its last heartbeat (see heartbeat.go).
// Unanswered keep-alives are retried until the validity runs out.
func (s *Store) keepAlive(ctx context.Context, sess *session) {
	defer sess.end()
	t := time.NewTimer(sess.ttl / 3)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
		valid := sess.validUntil()
		sent := time.Now()
		if !sent.Before(valid) {
			return // lost: nothing acknowledged within the TTL
		}
		kctx, cancel := context.WithDeadline(ctx, valid)
		resp, err := s.c.KeepAliveOnce(kctx, sess.id)
		renewed := time.Duration(0)
		if err == nil && resp.TTL > 0 {
			renewed = min(time.Duration(resp.TTL)*time.Second, sess.ttl) // see session
			err = s.beat(kctx, sess.id, renewed)
		}
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err == nil && resp.TTL > 0:
			sess.setValid(sent.Add(renewed))
			t.Reset(max(renewed/3-time.Since(sent), time.Millisecond))
		case err == nil || isLeaseNotFound(err):
			return // expired on the server
		default: // unreachable, or an election: try again soon
			t.Reset(min(200*time.Millisecond, time.Until(valid)/2+time.Millisecond))
		}
	}
}

func (sess *session) validUntil() time.Time {
	sess.mu.Lock()
	defer sess.mu.Unlock()
	return sess.valid
}

func (sess *session) setValid(t time.Time) {
	sess.mu.Lock()
	defer sess.mu.Unlock()
	if t.After(sess.valid) {
		sess.valid = t
	}
}

// end marks the session over and ends its leases as lost.
func (sess *session) end() {
	sess.mu.Lock()
	select {
	case <-sess.done:
		sess.mu.Unlock()
		return
	default:
	}
	close(sess.done)
	leases := sess.leases
	sess.leases = nil
	sess.mu.Unlock()
	sess.cancel()
	for l := range leases {
		l.End(lockdriver.Lost)
	}
}

func (sess *session) add(l *lease) bool {
	sess.mu.Lock()
	defer sess.mu.Unlock()
	if sess.leases == nil {
		return false
	}
	sess.leases[l] = struct{}{}
	return true
}

func (sess *session) remove(l *lease) {
	sess.mu.Lock()
	defer sess.mu.Unlock()
	delete(sess.leases, l)
}

var errSessionLost = errors.New("session lease lost")

var (
	_ lock.Locker            = (*Store)(nil)
	_ lockdriver.Store       = (*lease)(nil)
	_ lockdriver.DoneWatcher = (*lease)(nil)
	_ lockdriver.Deadliner   = (*lease)(nil)
)

// Ping is a health check for readiness probes: a linearizable read (it
// needs the cluster's leader and a quorum).
func (s *Store) Ping(ctx context.Context) error {
	if _, err := s.c.Get(ctx, "oncekit-ping", clientv3.WithCountOnly()); err != nil {
		return fmt.Errorf("etcdstore: ping: %w", err)
	}
	return nil
}
