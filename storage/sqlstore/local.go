package sqlstore

import (
	"sync"
	"time"

	"github.com/oncekit/oncekit/core/idem"
)

// localClaims are the claims this Store holds in flight, by record key.
// A duplicate that comes to the same process while one runs — a client's
// retry on the same replica, a message redelivered to the same consumer —
// is answered from here: its Begin finds the claim in flight (or its
// fingerprint mismatched) with no statement, and its wait is woken by the
// claim's finish in this process, with no mark on the record, no
// notification and no polling. The record stays the truth: an entry is
// trusted only until the claim's lease ends as the Store last set it (a
// claim lost to its lease, taken over by another process, is looked up in
// the database from then on), and a duplicate woken here reads the
// record from the database, as any other Begin does.
type localClaims struct {
	mu   sync.Mutex
	m    map[string]localClaim
	adds int // since the last sweep of ended entries
}

type localClaim struct {
	tok   string
	fp    string
	until time.Time // the end of the claim's lease, never after the database's
}

// add records the claim tok holds on key until until.
func (l *localClaims) add(key, tok, fp string, until time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = map[string]localClaim{}
	}
	l.m[key] = localClaim{tok: tok, fp: fp, until: until}
	// A claim that ended without a finish here (its lease lost while it
	// ran) is dropped by a sweep once in a while.
	if l.adds++; l.adds >= 1024 && l.adds >= len(l.m) {
		l.adds = 0
		now := time.Now()
		for k, c := range l.m {
			if !now.Before(c.until) {
				delete(l.m, k)
			}
		}
	}
}

// extend moves the end of tok's claim on key to until.
func (l *localClaims) extend(key, tok string, until time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c, ok := l.m[key]; ok && c.tok == tok {
		c.until = until
		l.m[key] = c
	}
}

// done forgets tok's claim on key, and reports whether it was known.
func (l *localClaims) done(key, tok string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c, ok := l.m[key]; ok && c.tok == tok {
		delete(l.m, key)
		return true
	}
	return false
}

// drop forgets any claim on key.
func (l *localClaims) drop(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.m, key)
}

// get returns the claim this Store holds in flight on key, if its lease
// has not ended.
func (l *localClaims) get(key string) (localClaim, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c, ok := l.m[key]
	if ok && !time.Now().Before(c.until) {
		delete(l.m, key)
		return localClaim{}, false
	}
	return c, ok
}

// begin answers a Begin of k with fingerprint from a claim this Store
// holds in flight on it: in flight, or a mismatch. ok is false when it
// holds none.
func (l *localClaims) begin(k idem.Key, fingerprint string) (idem.Claim, bool) {
	c, ok := l.get(k.String())
	if !ok {
		return idem.Claim{}, false
	}
	out := idem.Claim{Key: k, Fingerprint: fingerprint, Expires: c.until, State: idem.InFlight}
	if c.fp != fingerprint {
		out.State = idem.Mismatch
	}
	return out, true
}

// finished forgets c's claim once this Store has finished it (completed,
// abandoned, or failed to, the claim being lost), and wakes the waiters
// of its record in this process when it was known.
func (s *Store) finished(c idem.Claim) {
	key := c.Key.String()
	if s.local.done(key, c.Token) {
		s.wakeRecord(key)
	}
}
