package memstore

import "github.com/oncekit/oncekit/core/observe"

// Option configures a Store.
type Option func(*Store)

// WithObserver sets where the Store reports hand-offs, and where the
// lock.Mutex and idem.Guard built on it report their operations (see
// package observe). Default: none.
func WithObserver(o observe.Observer) Option { return func(s *Store) { s.observer = o } }

// WithMaxRecords bounds how many idempotency records the Store keeps. When
// a new claim would exceed it, the records completed longest ago are
// evicted first (a duplicate of an evicted key runs again, as after its
// retention); in-flight claims are never evicted: when they alone reach
// the bound, Begin fails with ErrFull. Default DefaultMaxRecords (100 000).
func WithMaxRecords(n int) Option { return func(s *Store) { s.maxRecords = n } }

// WithMaxBytes bounds the bytes of stored results; the records completed
// longest ago are evicted to stay within it. One result larger than the
// bound is refused with idem.ErrResultTooLarge before anything (an effect
// included) is applied, rather than stored and evicted at once. Default
// DefaultMaxBytes (256 MiB).
func WithMaxBytes(n int64) Option { return func(s *Store) { s.maxBytes = n } }
