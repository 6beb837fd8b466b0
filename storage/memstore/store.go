package memstore

import (
	"context"
	"fmt"
	"sync"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/lock/lockdriver"
	"github.com/oncekit/oncekit/core/observe"
)

// Store is the in-process driver. The zero value is not usable; call New.
type Store struct {
	mu      sync.Mutex
	locks   map[string]*entry
	records map[string]*record    // idempotency records (idemdriver.Store)
	ended   map[string]ended      // claims that ended without completing
	fence   uint64                // one counter for all keys: strictly increasing per key too (nextFence)
	items   map[string]*stockItem // stock (stockdriver.Store)

	completed   completedList // oldest completion first: evicted first
	resultBytes int64         // the completed records' results, in bytes
	maxRecords  int
	maxBytes    int64

	observer observe.Observer

	closed  bool          // Close was called: new calls fail with lock.ErrClosed
	closing chan struct{} // closed by Close: waiters give up
}

// Defaults of the bounds on idempotency records.
const (
	DefaultMaxRecords = 100_000
	DefaultMaxBytes   = 256 << 20
)

// Close implements io.Closer, as every driver does (see package storage):
// after it, Acquire, TryAcquire, Begin and WaitChange fail with an error
// matching lock.ErrClosed, and Acquires waiting for a key give up with it.
// Leases and claims taken before can still be released, completed or
// abandoned. Close is idempotent.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.closed = true
		close(s.closing)
	}
	return nil
}

// closedErr is the error of a call op on key after Close.
func closedErr(op, key string) error {
	return fmt.Errorf("memstore: %s %q: %w", op, key, lock.ErrClosed)
}

// DriverName implements observe.Source: "memory".
func (s *Store) DriverName() string { return "memory" }

// Observer implements observe.Source.
func (s *Store) Observer() observe.Observer { return s.observer }

// New returns an empty Store.
func New(opts ...Option) *Store {
	s := &Store{locks: make(map[string]*entry), maxRecords: DefaultMaxRecords, maxBytes: DefaultMaxBytes, closing: make(chan struct{})}
	for _, o := range opts {
		o(s)
	}
	s.maxRecords, s.maxBytes = max(s.maxRecords, 1), max(s.maxBytes, 0)
	return s
}

var (
	_ lock.Locker          = (*Store)(nil)
	_ lockdriver.Store     = (*lease)(nil)
	_ lockdriver.Deadliner = (*lease)(nil)
)

// Ping implements the stores' health check: a memory store is always up.
func (s *Store) Ping(ctx context.Context) error { return ctx.Err() }
