package sqlstore

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/oncekit/oncekit/core/idem/idemdriver"
)

// localClaims are the claims this Store holds in flight, by record key.
// A duplicate that comes to the same process while one runs — a client's
// retry on the same replica, a message redelivered to the same consumer —
// is answered from here: its Begin finds the claim in flight (or its
// fingerprint mismatched) with no statement, and its wait is woken by the
// claim's finish in this process, with no mark on the record, no
// notification and no polling. A duplicate that comes while the first
// copy's Begin is still on its way waits for that Begin's answer first.
// The record stays the truth: an entry is trusted only until the claim's lease ends as the Store last set it (a
// claim lost to its lease, taken over by another process, is looked up in
// the database from then on), and a duplicate woken here reads the
// record from the database, as any other Begin does.
type localClaims struct {
	mu     sync.Mutex
	m      map[string]localClaim
	begins map[string]*pending  // Begins of this Store in flight, by key
	ended  map[string]time.Time // keys whose claim this Store finished lately, and when
	writes int                  // to m and ended since the last sweep
}

// maxEnded bounds the keys a Store remembers as finished lately.
const maxEnded = 8192

// endedFor is how long a key whose claim this Store finished counts as
// held: the duplicates its finish woke look at the record first.
const endedFor = time.Second

// pending is a Begin in flight; a second Begin of its key waits for it
// (done, made by the first to wait) and then answers from its answer, so
// that copies of a request that arrive together cost one statement.
type pending struct {
	done chan struct{}
	fp   string           // the first Begin's fingerprint
	c    idemdriver.Claim // and its answer, once done is closed (when err is nil)
	err  error
}

// share answers a Begin of k with fingerprint from p's answer, when that
// tells: a completed record or a claim in flight (the first Begin's,
// registered in m, is answered from there) with p's fingerprint, which is
// also a mismatch for another one, and a mismatch for p's own.
func (p *pending) share(k idemdriver.Key, fingerprint string) (idemdriver.Claim, bool) {
	if p.err != nil {
		return idemdriver.Claim{}, false
	}
	c := idemdriver.Claim{Key: k, Fingerprint: fingerprint, Expires: p.c.Expires}
	switch {
	case p.c.State == idemdriver.Mismatch && fingerprint == p.fp:
		c.State = idemdriver.Mismatch
	case p.c.State != idemdriver.Completed && p.c.State != idemdriver.InFlight:
		return idemdriver.Claim{}, false
	case fingerprint != p.fp:
		c.State = idemdriver.Mismatch
	case p.c.State == idemdriver.Completed:
		c.State, c.Result = idemdriver.Completed, slices.Clone(p.c.Result)
	default:
		c.State = idemdriver.InFlight
	}
	return c, true
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
	l.wroteLocked()
}

// wroteLocked counts a write to m or ended, and sweeps both once in a
// while (every 1 024 writes, and not more often than their size): a claim
// that ended without a finish here (its lease lost while it ran), and a
// finish remembered for longer than endedFor.
func (l *localClaims) wroteLocked() {
	if l.writes++; l.writes < 1024 || l.writes < len(l.m)+len(l.ended) {
		return
	}
	l.writes = 0
	now := time.Now()
	for k, c := range l.m {
		if !now.Before(c.until) {
			delete(l.m, k)
		}
	}
	for k, at := range l.ended {
		if now.Sub(at) >= endedFor {
			delete(l.ended, k)
		}
	}
}

// claimLocked returns the claim on key whose lease has not ended, and
// forgets one that has.
func (l *localClaims) claimLocked(key string) (localClaim, bool) {
	c, ok := l.m[key]
	if ok && !time.Now().Before(c.until) {
		delete(l.m, key)
		return localClaim{}, false
	}
	return c, ok
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
	c, ok := l.m[key]
	if !ok || c.tok != tok {
		return false
	}
	delete(l.m, key)
	// Remembered a moment (at most maxEnded keys), for the Begins of the
	// duplicates this finish wakes.
	if l.ended == nil {
		l.ended = map[string]time.Time{}
	}
	if len(l.ended) < maxEnded {
		l.ended[key] = time.Now()
	}
	l.wroteLocked()
	return true
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
	return l.claimLocked(key)
}

// begin answers a Begin of k with fingerprint from a claim this Store
// holds in flight on it: in flight, or a mismatch (ok). Otherwise, when
// another Begin of k is in flight in this Store, it waits for that one
// (or for ctx) and answers from its answer where that tells (ok), else
// looks again; when none is, it returns a done function that the
// caller's own Begin must call with its answer.
func (l *localClaims) begin(ctx context.Context, k idemdriver.Key, fingerprint string) (c idemdriver.Claim, ok bool, done func(idemdriver.Claim, error), err error) {
	key := k.String()
	for {
		l.mu.Lock()
		if lc, held := l.claimLocked(key); held {
			l.mu.Unlock()
			c = idemdriver.Claim{Key: k, Fingerprint: fingerprint, Expires: lc.until, State: idemdriver.InFlight}
			if lc.fp != fingerprint {
				c.State = idemdriver.Mismatch
			}
			return c, true, nil, nil
		}
		p := l.begins[key]
		if p == nil {
			if l.begins == nil {
				l.begins = map[string]*pending{}
			}
			p = &pending{fp: fingerprint}
			l.begins[key] = p
			l.mu.Unlock()
			return idemdriver.Claim{}, false, func(c idemdriver.Claim, err error) {
				l.mu.Lock()
				delete(l.begins, key)
				p.c, p.err = c, err
				wake := p.done
				l.mu.Unlock()
				if wake != nil {
					close(wake)
				}
			}, nil
		}
		if p.done == nil {
			p.done = make(chan struct{})
		}
		wait := p.done
		l.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return idemdriver.Claim{}, false, nil, ctx.Err()
		}
		l.mu.Lock()
		_, held := l.m[key] // (the first Begin's claim: answered above)
		c, ok = p.share(k, fingerprint)
		l.mu.Unlock()
		if ok && !held {
			return c, true, nil, nil
		}
	}
}

// finished forgets c's claim once this Store has finished it (completed,
// abandoned, or failed to, the claim being lost), and wakes the waiters
// of its record in this process when it was known.
func (s *Store) finished(c idemdriver.Claim) {
	key := c.Key.String()
	if s.local.done(key, c.Token) {
		s.wakeRecord(key)
	}
}

// finishedLately reports whether this Store finished a claim on key less
// than endedFor ago.
func (l *localClaims) finishedLately(key string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	at, ok := l.ended[key]
	return ok && time.Since(at) < endedFor
}
