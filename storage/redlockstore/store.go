package redlockstore

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/lock/lockdriver"
	"github.com/oncekit/oncekit/core/observe"
	"github.com/oncekit/oncekit/storage/internal/keep"
	"github.com/oncekit/oncekit/storage/internal/keyq"
	"github.com/oncekit/oncekit/storage/internal/rediskit"
	"github.com/oncekit/oncekit/storage/internal/redisnotify"
)

// Client is the part of go-redis each node's client must offer:
// redis.Scripter, Subscribe, SSubscribe and Info. *redis.Client satisfies
// it. Each node is an independent Redis server (not replicas of one
// another, not one Cluster).
type Client interface {
	redis.Scripter
	Subscribe(ctx context.Context, channels ...string) *redis.PubSub
	SSubscribe(ctx context.Context, channels ...string) *redis.PubSub
	Info(ctx context.Context, section ...string) *redis.StringCmd
	Time(ctx context.Context) *redis.TimeCmd
}

// Store is a lock.Locker, an idemdriver.Store (Begin, Complete, Abandon and
// Extend, each a round to every node that needs a majority) and an
// inspector (lockdriver.Inspector, idemdriver.Inspector) over N independent Redis
// nodes with majority quorum. It is safe for concurrent use; Close releases its
// pub/sub connections.
type Store struct {
	base    rediskit.Base     // what both Redis drivers share (options, names, script calls)
	fin     rediskit.Finisher // idemdriver.Store's Complete, Abandon and Extend
	redlock redlockOptions
	nodes   []*node
	ring    []int // the nodes' indexes in the order of their names (keyRing)
	rank    []int // ... and each node's place in it
	quorum  int
	local   keyq.Queue // one competitor per key in this Store

	linger   time.Duration
	handOffs keep.HandOffs
	recent   keep.Recent        // when this Store last let each key go (lease.hot)
	crowded  keep.Marks         // keys whose queues held processes lately (Acquire)
	kept     keep.Holds[*lease] // holds kept after their Release (kept.go)

	closed    chan struct{}
	closeOnce sync.Once
	owned     func() error // closes the clients storage.Open made (nil for New's)
	ownOnce   sync.Once
}

type node struct {
	index   int // in Store.nodes
	name    string
	c       Client
	sub     *redisnotify.Subscriber
	lastErr atomic.Pointer[error] // the node's last failure, nil after a success

	pending    atomic.Int32 // requests in flight to the node
	busySince  atomic.Int64 // when the node last went from idle to busy (Unix ns)
	lastAnswer atomic.Int64 // when it last answered anything (Unix ns)
}

// noted records the outcome of a request to n.
func (n *node) noted(err error) {
	if err != nil {
		n.lastErr.Store(&err)
	} else if n.lastErr.Load() != nil {
		n.lastErr.Store(nil)
	}
}

// lastFailure is n's last failure as a round reports it for a node it did
// not wait for.
func (n *node) lastFailure() error {
	if last := n.lastErr.Load(); last != nil && *last != errNodeTimeout {
		return fmt.Errorf("not waited for; last error: %w", *last)
	}
	return errNodeTimeout
}

// sending and answered bracket every request to n.
func (n *node) sending() {
	if n.pending.Add(1) == 1 {
		n.busySince.Store(time.Now().UnixNano())
	}
}

func (n *node) answered(err error) {
	n.noted(err)
	n.lastAnswer.Store(time.Now().UnixNano())
	n.pending.Add(-1)
}

// suspectAfter is how long a node with requests in flight may stay silent
// before rounds stop counting on it: far above a loopback or LAN answer,
// and above the scheduling hiccups of a loaded machine.
const suspectAfter = 500 * time.Millisecond

// isSuspect reports whether rounds should not wait for n: its last
// request failed, or it has had requests in flight and answered nothing
// for suspectAfter (a paused or partitioned node).
func (n *node) isSuspect() bool {
	if n.lastErr.Load() != nil {
		return true
	}
	if n.pending.Load() == 0 {
		return false
	}
	quiet := max(n.busySince.Load(), n.lastAnswer.Load())
	return time.Since(time.Unix(0, quiet)) > suspectAfter
}

// suspect marks n as failing after it missed a round's timeout, unless a
// real failure is already known: later rounds do not wait for it.
func (n *node) suspect() {
	if n.lastErr.Load() == nil {
		err := errNodeTimeout
		n.lastErr.CompareAndSwap(nil, &err)
	}
}

// timeoutErr is the failure of a node that did not answer within a round:
// errNodeTimeout, with the node's last real failure when it had one (a
// refused connection answers late, after go-redis' own retries).
func (n *node) timeoutErr() error {
	if last := n.lastErr.Load(); last != nil && *last != errNodeTimeout {
		return fmt.Errorf("%w; last error: %w", errNodeTimeout, *last)
	}
	return errNodeTimeout
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
		redlock:  o.redlockOptions,
		quorum:   len(clients)/2 + 1,
		closed:   make(chan struct{}),
		linger:   o.linger,
		handOffs: keep.HandOffs{Max: o.maxHandOffs, Hold: o.maxHold},
		crowded:  keep.Marks{For: redisnotify.Linger}, // while the subscriptions linger
	}
	s.base.Init(o.Options)
	s.base.StrictLeases = true // see rediskit.Base.StrictLeases
	s.fin.FinishClaim = s.finishClaim
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
		s.nodes = append(s.nodes, &node{index: len(s.nodes), name: name, c: c, sub: redisnotify.New(c, o.PubSub)})
	}
	s.keyRing(len(seen) == len(clients))
	return s, nil
}

// keyRing orders the nodes for leaderNode and queueNode: by address when
// every client has one, so that processes which list the same servers in
// different orders still agree on each key's leader and queue nodes;
// otherwise in the order given.
func (s *Store) keyRing(byName bool) {
	s.ring = make([]int, len(s.nodes))
	for i := range s.ring {
		s.ring[i] = i
	}
	if byName {
		slices.SortFunc(s.ring, func(a, b int) int { return strings.Compare(s.nodes[a].name, s.nodes[b].name) })
	}
	s.rank = make([]int, len(s.nodes))
	for r, i := range s.ring {
		s.rank[i] = r
	}
}

// FromClients turns go-redis clients, one per node, into New's argument:
//
//	s, err := redlockstore.New(redlockstore.FromClients(c1, c2, c3))
func FromClients(clients ...*redis.Client) []Client {
	out := make([]Client, len(clients))
	for i, c := range clients {
		if c != nil {
			out[i] = c
		}
	}
	return out
}

// Quorum is the number of nodes an operation must reach: N/2 + 1.
func (s *Store) Quorum() int { return s.quorum }

// Close releases the holds the Store kept after their Release (see
// WithLinger), closes the pub/sub connections, wakes waiters (they fail
// with lock.ErrClosed), and waits for requests still in flight to finish
// their clean-up. It does not close clients given to New; a Store
// storage.Open made closes the clients it opened.
func (s *Store) Close() error {
	s.releaseKept()
	var errs []error
	s.closeOnce.Do(func() {
		close(s.closed)
		for _, n := range s.nodes {
			errs = append(errs, n.sub.Close())
		}
	})
	s.base.BG.Wait()
	if s.owned != nil {
		s.ownOnce.Do(func() { errs = append(errs, s.owned()) })
	}
	return errors.Join(errs...)
}

// Clients returns the clients the Store was made with, one per node, in
// the order given (for a Store that storage.Open made, the *redis.Client
// of each node in the URL's order).
func (s *Store) Clients() []Client {
	out := make([]Client, len(s.nodes))
	for i, n := range s.nodes {
		out[i] = n.c
	}
	return out
}

// Warm opens n connections of each node's pool ahead of traffic and hands
// them back idle (see redisstore's Warm); n ≤ 0 opens as many as a pool
// holds. A node that does not answer is an error, and the other nodes are
// warmed all the same.
func (s *Store) Warm(ctx context.Context, n int) error {
	select {
	case <-s.closed:
		return fmt.Errorf("redlockstore: warm: %w", lock.ErrClosed)
	default:
	}
	var errs []error
	for i, nd := range s.nodes {
		if err := rediskit.Warm(ctx, nd.c, n); err != nil {
			errs = append(errs, fmt.Errorf("node %d: %w", i, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("redlockstore: warm: %w", err)
	}
	return nil
}

const driverName = "redlock"

// DriverName implements observe.Source: "redlock".
func (s *Store) DriverName() string { return driverName }

// Observer implements observe.Source: the WithObserver option.
func (s *Store) Observer() observe.Observer { return s.base.Options.Observer }

// nodeTimeout is how long a round for a lease of ttl waits for a node.
func (s *Store) nodeTimeout(ttl time.Duration) time.Duration {
	if s.redlock.nodeTimeout > 0 {
		return s.redlock.nodeTimeout
	}
	return min(max(ttl/10, 50*time.Millisecond), time.Second)
}

// drift is the clock drift allowance subtracted from a lease's validity.
func (s *Store) drift(ttl time.Duration) time.Duration {
	return time.Duration(float64(ttl)*s.redlock.driftFactor) + s.redlock.driftFloor
}

// all is every node's index.
func (s *Store) all() []int {
	idx := make([]int, len(s.nodes))
	for i := range idx {
		idx[i] = i
	}
	return idx
}

// leaderNode is the node whose holder wins a split vote on key: every
// client agrees on it (keyRing), and one client at a time can hold it.
func (s *Store) leaderNode(key string) int {
	h := fnv.New32a()
	h.Write([]byte(key))
	return s.ring[h.Sum32()%uint32(len(s.nodes))]
}

// queueNode reports whether node i keeps key's waiting queue: the key's
// leader node and the quorum − 1 nodes after it (keyRing). Waiting processes queue
// on these nodes only, and only their releases wake anyone: on the other
// nodes a key is taken and released with the short scripts, as a key
// nobody waits for. Every majority includes a queue node, so a key a
// release reserves there for the member it woke cannot be taken by anyone
// else meanwhile (bounded barging).
func (s *Store) queueNode(key string, i int) bool {
	n := len(s.nodes)
	return (s.rank[i]-s.rank[s.leaderNode(key)]+n)%n < s.quorum
}

// queueNodes lists key's queue nodes (queueNode).
func (s *Store) queueNodes(key string) []int {
	idx := make([]int, 0, s.quorum)
	for i := range s.nodes {
		if s.queueNode(key, i) {
			idx = append(idx, i)
		}
	}
	return idx
}

func (s *Store) quorumError(op, key string, got int, failed map[int]error) *QuorumError {
	e := &QuorumError{Op: op, Key: key, Need: s.quorum, Got: got, Failed: map[string]error{}}
	for i, err := range failed {
		e.Failed[s.nodes[i].name] = err
	}
	return e
}

// holdWait is how long until enough busy nodes free up for a majority: the
// k-th smallest remaining TTL among them, or -1 if one has no expiry. The
// round asked asked nodes; those that did not answer busy count as free.
func (s *Store) holdWait(busy map[int]int64, asked int) time.Duration {
	need := s.quorum - (asked - len(busy))
	if need <= 0 {
		return 0
	}
	ttls := slices.Sorted(func(yield func(int64) bool) {
		for _, t := range busy {
			if !yield(t) {
				return
			}
		}
	})
	if ttls[0] < 0 { // -1 or -2 sort first: some node's key has no expiry
		return -1
	}
	return time.Duration(ttls[need-1]) * time.Millisecond
}

// ttlOf is a node's PTTL reply as a duration; -1 when the key there has
// no expiry.
func ttlOf(pttl int64) time.Duration {
	if pttl < 0 {
		return -1
	}
	return time.Duration(pttl) * time.Millisecond
}

func indexes[V any](m map[int]V) []int {
	idx := make([]int, 0, len(m))
	for i := range m {
		idx = append(idx, i)
	}
	slices.Sort(idx)
	return idx
}

var (
	_ lock.Locker          = (*Store)(nil)
	_ idemdriver.Store     = (*Store)(nil)
	_ idemdriver.Waiter    = (*Store)(nil)
	_ lockdriver.Inspector = (*Store)(nil)
	_ idemdriver.Inspector = (*Store)(nil)
)

// Ping is a health check for readiness probes: a TIME request to every
// node at once, healthy once a majority answers, within a second (or
// WithNodeTimeout's, when set) whatever the clients' own timeouts;
// otherwise a *QuorumError naming the nodes that did not, or ctx's error
// when it ends first. A lock request's node timeout is a tenth of its TTL:
// too short for a probe whose request may have to dial the node first (a
// TLS handshake on a busy machine).
func (s *Store) Ping(ctx context.Context) error {
	v := s.poll(ctx, s.all(), s.nodeTimeout(10*time.Second), false, func(ctx context.Context, n *node) (bool, error) {
		return true, n.c.Time(ctx).Err()
	})
	switch {
	case v.yes >= s.quorum:
		return nil
	case v.ctxErr != nil:
		return fmt.Errorf("redlockstore: ping: %w", v.ctxErr)
	}
	return s.quorumError("ping", "", v.yes, v.failed)
}
