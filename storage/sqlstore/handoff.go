package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/lock/lockdriver"
	"github.com/oncekit/oncekit/core/observe"
	"github.com/oncekit/oncekit/storage/internal/keep"
)

// This file is the hand-off of a key from a lease of the Store straight
// to the next of the Store's acquisitions waiting for it (gate.go),
// rather than a release and a take through the database, as the Redis,
// Redlock and etcd drivers hand keys on.
//
// The key's row stays the truth: it keeps the token of the Store's hold
// and an expiry by the server's clock, and every lease of the hold uses
// that token. The first hand-off of a hold renews the row's expiry and
// raises its fence by reservedFences in one statement (renewHold); the
// hold's next leases take the fences reserved, one above the other, with
// no round trip while the row has most of the next lease's TTL left
// (more than 7/8 of it, as the lease's deadline counts it). Every fence
// issued later — after the hold's release, its expiry, a ForceRelease —
// is above the row's fence, so above every fence the hold handed out.
// The Store hands a key on for WithMaxLocalHandOffs hand-offs or
// WithMaxLocalHold after it took the key, whichever is more, and then
// releases it, so that other processes get their turn.

// reservedFences is how many fences a hold reserves in its row at once.
const reservedFences = keep.ReservedFences

// hold is one tenure of a key's row by a token of this Store, passed
// from lease to lease by hand-offs. mu is held across the statements
// that change the row's expiry (a refresh, a renewal), so that deadline
// is the row's.
type hold struct {
	mu       sync.Mutex
	took     time.Time // when the Store took the key (WithMaxLocalHold counts from it)
	handOffs int       // hand-offs so far
	next     int64     // the fence of the hold's next lease
	last     int64     // the highest fence the row reserved for the hold: next <= last needs no round trip
	deadline time.Time // the row's expiry, counted here from before the statement that set it
	current  *lease    // the hold's live lease; the others are released
}

// handOff passes l's key to the first acquisition of this Store waiting
// for it, when the hand-off budget allows. It reports whether it took
// care of l's release, and the error for Release to return; when l was
// handed on already, it did, with no error.
func (s *Store) handOff(ctx context.Context, l *lease) (bool, error) {
	h := l.hold
	start := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.current != l {
		return true, nil // released already: its hold went on
	}
	if l.State() != lockdriver.Live || !s.handOffs.Left(h.handOffs, h.took) || s.closed() {
		return false, nil
	}
	w := s.gates.first(l.key)
	if w == nil {
		return false, nil
	}
	deadline := h.deadline
	if h.next > h.last || time.Until(deadline) <= w.ttl-w.ttl/8 {
		renewed := time.Now()
		last, err := s.renewHold(ctx, l.key, l.Token(), w.ttl)
		if err != nil {
			s.gates.giveBack(l.key, w)
			return true, err
		}
		h.next, h.last = max(h.next, last-reservedFences+1), last
		deadline = renewed.Add(w.ttl)
		h.deadline = deadline
	}
	next := s.makeLease(l.key, l.Token(), h.next, deadline, l.pin.move(), h)
	h.next++
	h.handOffs++
	h.current = next
	l.EndQuietly(lockdriver.Released)
	w.ch <- next
	observe.Record(ctx, s.observer, observe.Event{
		Op: observe.LockHandOff, Driver: s.DriverName(), Key: l.key, Outcome: observe.Local,
		Fence: next.Fence(), Duration: time.Since(start),
	})
	return true, nil
}

// renewHold extends the row of key's hold by tok to ttl and reserves the
// next reservedFences fences; it returns the row's new fence, the highest
// reserved. An error matches lock.ErrLockLost when the row is not the
// hold's any more.
func (s *Store) renewHold(ctx context.Context, key, tok string, ttl time.Duration) (int64, error) {
	var last int64
	if s.dialect == Postgres {
		err := s.queryRow(ctx, s.q.renewHold, []byte(key), tok, us(ttl)).Scan(&last)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			return 0, fmt.Errorf("sqlstore: release %q: %w", key, lock.ErrLockLost)
		case err != nil:
			return 0, s.errWrap("release", key, err)
		}
		return last, nil
	}
	res, err := s.exec(ctx, s.q.renewHold, us(ttl), []byte(key), tok)
	if err != nil {
		return 0, s.errWrap("release", key, err)
	}
	// (The statement always changes a row it matches: its fence.)
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		return 0, fmt.Errorf("sqlstore: release %q: %w", key, lock.ErrLockLost)
	}
	if last, err = res.LastInsertId(); err != nil {
		return 0, s.errWrap("release", key, err)
	}
	return last, nil
}

// refreshHold is a refresh of l, a lease of hold h: the hold's deadline
// follows the row's expiry.
func (s *Store) refreshHold(ctx context.Context, l *lease, ttl time.Duration) (time.Time, error) {
	h := l.hold
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.current != l {
		return time.Time{}, fmt.Errorf("sqlstore: refresh %q: %w", l.key, lock.ErrLockLost)
	}
	d, err := s.refresh(ctx, l.key, l.Token(), ttl)
	if err == nil {
		h.deadline = d
	}
	return d, err
}

// move returns a pin of p's connection for the next lease of a hold, and
// leaves p without it; nil when p has none.
func (p *pin) move() *pin {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn == nil {
		return nil
	}
	next := &pin{conn: p.conn, s: p.s}
	p.conn = nil
	return next
}
