package memstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/lock/lockdriver"
	"github.com/oncekit/oncekit/storage/internal/token"
)

// record is one idempotency record. Records live in their own map, beside
// the locks, under the Store's mutex.
type record struct {
	key      string
	fp       string
	token    string
	fence    uint64
	attempt  int  // Claim.Attempt
	done     bool // completed; else in flight
	expires  time.Time
	result   []byte
	changed  chan struct{} // made by the first WaitChange; closed when the record is completed or removed
	isClosed bool
	// prev and next link the record into Store.completed once completed
	// (inCompleted): a list through the records themselves, so that a
	// completion allocates no list element.
	prev, next  *record
	inCompleted bool
}

// completedList is the Store's completed records, oldest completion first
// (evicted first), linked through the records.
type completedList struct{ head, tail *record }

func (l *completedList) pushBack(r *record) {
	r.prev, r.next, r.inCompleted = l.tail, nil, true
	if l.tail != nil {
		l.tail.next = r
	} else {
		l.head = r
	}
	l.tail = r
}

func (l *completedList) remove(r *record) {
	if r.prev != nil {
		r.prev.next = r.next
	} else {
		l.head = r.next
	}
	if r.next != nil {
		r.next.prev = r.prev
	} else {
		l.tail = r.prev
	}
	r.prev, r.next, r.inCompleted = nil, nil, false
}

// ErrFull reports a Begin refused because WithMaxRecords claims are in
// flight: completed records can be evicted, in-flight claims cannot.
var ErrFull = errors.New("memstore: too many idempotency claims in flight")

// dropRecordLocked forgets key's record r, waking its waiters.
func (s *Store) dropRecordLocked(key string, r *record) {
	r.signal()
	if r.inCompleted {
		s.completed.remove(r)
		s.resultBytes -= int64(len(r.result))
	}
	if s.records[key] == r {
		delete(s.records, key)
	}
}

// evictLocked drops the records completed longest ago until room records
// more and extra bytes more fit, and reports whether they do.
func (s *Store) evictLocked(room int, extra int64) bool {
	for len(s.records)+room > s.maxRecords || s.resultBytes+extra > s.maxBytes {
		r := s.completed.head
		if r == nil {
			break
		}
		s.dropRecordLocked(r.key, r)
	}
	return len(s.records)+room <= s.maxRecords
}

// ended is what the Store remembers of a key's claims that ended without
// completing: how many, and until when (idem.AttemptMemory).
type ended struct {
	attempts int
	until    time.Time
}

// rememberEndLocked remembers that key's claim number attempt ended without
// completing. The memory is bounded like the records: when it is full, an
// entry that expired goes, else any.
func (s *Store) rememberEndLocked(key string, attempt int, now time.Time) {
	if s.ended == nil {
		s.ended = map[string]ended{}
	}
	if _, ok := s.ended[key]; !ok && len(s.ended) >= s.maxRecords {
		var any string
		for k, e := range s.ended {
			any = k
			if now.After(e.until) {
				break
			}
		}
		delete(s.ended, any)
	}
	s.ended[key] = ended{attempts: attempt, until: now.Add(idem.AttemptMemory)}
}

// nextAttemptLocked is the Attempt of a new claim of key (and forgets
// what was remembered).
func (s *Store) nextAttemptLocked(key string, now time.Time) int {
	e, ok := s.ended[key]
	if !ok {
		return 1
	}
	delete(s.ended, key)
	if now.After(e.until) {
		return 1
	}
	return e.attempts + 1
}

func (r *record) signal() {
	if !r.isClosed {
		r.isClosed = true
		if r.changed != nil {
			close(r.changed)
		}
	}
}

// recordLocked returns key's live record, dropping it if it has expired,
// and sweeps a few other expired records so that memory follows retention.
func (s *Store) recordLocked(key string) *record {
	if s.records == nil {
		s.records = map[string]*record{}
	}
	now := time.Now()
	swept := 0
	for k, r := range s.records {
		if swept >= 8 {
			break
		}
		swept++
		if !now.Before(r.expires) && k != key {
			s.expireLocked(k, r, now)
		}
	}
	r := s.records[key]
	if r != nil && !now.Before(r.expires) {
		s.expireLocked(key, r, now)
		r = nil
	}
	return r
}

// expireLocked drops key's record r whose lease or retention ran out.
func (s *Store) expireLocked(key string, r *record, now time.Time) {
	if !r.done {
		s.rememberEndLocked(key, r.attempt, now)
	}
	s.dropRecordLocked(key, r)
}

// Begin implements idemdriver.Store.
func (s *Store) Begin(ctx context.Context, k idemdriver.Key, fingerprint string, ttl time.Duration) (idemdriver.Claim, error) {
	if err := k.Check(); err != nil {
		return idemdriver.Claim{}, err
	}
	if err := lockdriver.ValidateTTL(ttl); err != nil {
		return idemdriver.Claim{}, err
	}
	key := k.String()
	if err := ctx.Err(); err != nil {
		return idemdriver.Claim{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return idemdriver.Claim{}, closedErr("begin", key)
	}
	r := s.recordLocked(key)
	if r == nil {
		if !s.evictLocked(1, 0) {
			return idemdriver.Claim{}, fmt.Errorf("memstore: begin %q: %w (%d)", key, ErrFull, s.maxRecords)
		}
		s.nextFenceLocked()
		now := time.Now()
		r = &record{key: key, fp: fingerprint, token: token.New(), fence: s.fence, attempt: s.nextAttemptLocked(key, now),
			expires: now.Add(ttl)}
		s.records[key] = r
		return idemdriver.Claim{Key: k, State: idemdriver.Acquired, Fingerprint: fingerprint, Token: r.token, Fence: r.fence,
			Attempt: r.attempt, Expires: r.expires}, nil
	}
	c := idemdriver.Claim{Key: k, Fingerprint: fingerprint, Expires: r.expires}
	switch {
	case r.fp != fingerprint:
		c.State = idemdriver.Mismatch
	case r.done:
		c.State, c.Result = idemdriver.Completed, slices.Clone(r.result)
	default:
		c.State = idemdriver.InFlight
	}
	return c, nil
}

// ownLocked returns c's record if c still holds it.
func (s *Store) ownLocked(c idemdriver.Claim, op string) (*record, error) {
	r := s.recordLocked(c.Key.String())
	if r == nil || r.done || r.token != c.Token || c.Token == "" {
		return nil, fmt.Errorf("memstore: %s %q: %w", op, c.Key, lock.ErrLockLost)
	}
	return r, nil
}

// Complete implements idemdriver.Store.
func (s *Store) Complete(ctx context.Context, c idemdriver.Claim, result []byte, retention time.Duration) error {
	if err := lockdriver.ValidateTTL(retention); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r, err := s.ownLocked(c, "complete")
	if err != nil {
		return err
	}
	if err := s.fits(c, result); err != nil {
		return err
	}
	s.completeLocked(r, slices.Clone(result), retention)
	return nil
}

// fits refuses a result larger than WithMaxBytes: stored, it would be
// evicted at once, and a retry would run again the work it completes.
// The claim stays in flight, for its holder to abandon.
func (s *Store) fits(c idemdriver.Claim, result []byte) error {
	if int64(len(result)) > s.maxBytes {
		return fmt.Errorf("memstore: complete %q: %w: %d bytes, WithMaxBytes %d", c.Key, idem.ErrResultTooLarge, len(result), s.maxBytes)
	}
	return nil
}

// completeLocked stores r's result, within the Store's bounds (fits).
func (s *Store) completeLocked(r *record, result []byte, retention time.Duration) {
	s.evictLocked(0, int64(len(result)))
	r.done, r.result, r.expires = true, result, time.Now().Add(retention)
	s.completed.pushBack(r)
	s.resultBytes += int64(len(result))
	r.signal()
}

// Abandon implements idemdriver.Store.
func (s *Store) Abandon(ctx context.Context, c idemdriver.Claim) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, err := s.ownLocked(c, "abandon")
	if err != nil {
		return err
	}
	s.rememberEndLocked(c.Key.String(), r.attempt, time.Now())
	s.dropRecordLocked(c.Key.String(), r)
	return nil
}

// Extend implements idemdriver.Store.
func (s *Store) Extend(ctx context.Context, c idemdriver.Claim, ttl time.Duration) error {
	if err := lockdriver.ValidateTTL(ttl); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r, err := s.ownLocked(c, "extend")
	if err != nil {
		return err
	}
	r.expires = time.Now().Add(ttl)
	return nil
}

// WaitChange implements idemdriver.Waiter: it returns when key's in-flight record
// is completed, abandoned or expires, or ctx ends.
func (s *Store) WaitChange(ctx context.Context, k idemdriver.Key, until time.Time) error {
	key := k.String()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return closedErr("wait for", key)
	}
	r := s.recordLocked(key)
	if r == nil || r.done || r.isClosed {
		s.mu.Unlock()
		return nil
	}
	if r.changed == nil {
		r.changed = make(chan struct{})
	}
	ch, exp := r.changed, r.expires
	s.mu.Unlock()
	t := time.NewTimer(max(time.Until(exp), 0) + time.Millisecond)
	defer t.Stop()
	select {
	case <-ch:
		return nil
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-s.closing:
		return closedErr("wait for", key)
	}
}

var (
	_ idemdriver.Store  = (*Store)(nil)
	_ idemdriver.Waiter = (*Store)(nil)
)
