package redlockstore

import (
	"context"
	"fmt"
	"time"

	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/lock/lockdriver"
	"github.com/oncekit/oncekit/storage/internal/rediskit"
	"github.com/oncekit/oncekit/storage/internal/token"
)

// Idempotency records (idemdriver.Store) on N independent nodes. Each node keeps
// the same record as redisstore does (one string with the claim's token
// and fence, and a completion channel). A claim is begun on every node at
// once and holds only with a majority; a completed record found on any
// node wins over everything else; Complete, Abandon and Extend go to every
// node and need a majority. A claim's fence is the highest of the claimed
// nodes' fences, checked against their clocks as a lock's is (fenceOf),
// and Complete and Abandon leave it on every node.

// Begin implements idemdriver.Store: one round to every node at once.
func (s *Store) Begin(ctx context.Context, key idemdriver.Key, fingerprint string, ttl time.Duration) (idemdriver.Claim, error) {
	if err := key.Check(); err != nil {
		return idemdriver.Claim{}, err
	}
	if err := lockdriver.ValidateTTL(ttl); err != nil {
		return idemdriver.Claim{}, err
	}
	select {
	case <-s.closed:
		return idemdriver.Claim{}, fmt.Errorf("redlockstore: begin %q: %w", key, lock.ErrClosed)
	default:
	}
	tok := token.New()
	now := time.Now()
	b := s.sendBegin(ctx, key, fingerprint, tok, ttl)
	if !b.claimed() && len(b.claims) > 0 {
		s.finishNodes(ctx, key, tok, rediskit.GiveBack, time.Millisecond, nil, indexes(b.claims), 0)
	}
	c := idemdriver.Claim{Key: key, Fingerprint: fingerprint, Expires: now.Add(time.Duration(b.pttl) * time.Millisecond)}
	switch {
	case b.corrupt != nil && b.corrupt.v.Code == rediskit.BeginUnknownLayout:
		return idemdriver.Claim{}, b.corrupt.v.LayoutError(key, s.nodes[b.corrupt.node].name)
	case b.corrupt != nil:
		return idemdriver.Claim{}, idemdriver.CorruptRecord(key.String(), s.nodes[b.corrupt.node].name+": "+b.corrupt.v.Reason)
	case b.done != nil:
		c.State, c.Result = idemdriver.Completed, b.done.v.Result
		return c, nil
	case b.ctxErr != nil:
		return idemdriver.Claim{}, b.ctxErr
	case b.claimed():
		fence, err := s.fenceOf("begin", key.String(), b.claims, b.clocks, ttl)
		if err != nil {
			s.finishNodes(context.WithoutCancel(ctx), key, tok, rediskit.GiveBack, time.Millisecond, nil, s.all(), 0)
			return idemdriver.Claim{}, err
		}
		c.State, c.Token, c.Fence, c.Attempt, c.Expires = idemdriver.Acquired, tok, fence, int(b.attempt), now.Add(ttl)
		return c, nil
	case b.answers < s.quorum:
		// Too few nodes answered to tell a live claim (or another
		// fingerprint's record) from a stale copy on a minority.
		return idemdriver.Claim{}, s.quorumError("begin", key.String(), b.answers, b.failed)
	case b.counts[rediskit.BeginMismatch] > 0:
		c.State = idemdriver.Mismatch
		return c, nil
	case b.counts[rediskit.BeginInFlight] > 0 || len(b.claims) > 0:
		c.State = idemdriver.InFlight
		return c, nil
	default:
		return idemdriver.Claim{}, s.quorumError("begin", key.String(), len(b.claims), b.failed)
	}
}

// beginRound is what the nodes answered to a Begin.
type beginRound struct {
	quorum  int
	claims  map[int]int64 // nodes claimed for our token: their fences
	clocks  map[int]int64 // ... and their clocks (µs) when they issued them
	counts  map[rediskit.BeginCode]int
	failed  map[int]error
	done    *answer[rediskit.BeginReply] // a node with the completed record
	corrupt *answer[rediskit.BeginReply]
	pttl    int64
	attempt int64 // the highest attempt of the claimed nodes: a node that missed an ended claim counts lower
	answers int   // nodes that answered (without an error)
	ctxErr  error
}

func (b *beginRound) claimed() bool {
	return len(b.claims) >= b.quorum && b.done == nil && b.corrupt == nil && b.ctxErr == nil
}

// sendBegin runs idem_begin on every node at once. A completed or corrupt
// record decides at once. Otherwise it waits for a majority of claims, or
// for a majority of answers once a claim is out of reach (a completed
// record lives on a majority, so any majority of answers includes it).
func (s *Store) sendBegin(ctx context.Context, key idemdriver.Key, fingerprint, tok string, ttl time.Duration) *beginRound {
	n := len(s.nodes)
	b := &beginRound{quorum: s.quorum, claims: map[int]int64{}, clocks: map[int]int64{}, counts: map[rediskit.BeginCode]int{}}
	r := newRound(s, s.all(), func(ctx context.Context, nd *node) (rediskit.BeginReply, error) {
		return s.base.Begin(ctx, nd.c, key, fingerprint, tok, ttl, nil)
	})
	answers := 0
	b.ctxErr = r.collect(ctx, s.nodeTimeout(ttl), func(a answer[rediskit.BeginReply]) bool {
		answers++
		if a.err != nil {
			return len(r.failed) > n-s.quorum
		}
		b.answers++
		b.counts[a.v.Code]++
		switch a.v.Code {
		case rediskit.BeginClaimed:
			b.claims[a.node], b.clocks[a.node] = a.v.N, a.v.Clock
			b.attempt = max(b.attempt, a.v.Attempt)
		case rediskit.BeginCompleted:
			b.done = &a
		case rediskit.BeginCorrupt, rediskit.BeginUnknownLayout:
			b.corrupt = &a
		default:
			b.pttl = max(b.pttl, a.v.N)
		}
		return b.done != nil || b.corrupt != nil || len(b.claims) >= s.quorum ||
			(answers >= s.quorum && len(b.claims)+n-answers < s.quorum)
	})
	b.failed = r.failed
	claimed := b.claimed()
	r.rest(func(a answer[rediskit.BeginReply]) { // a node claimed after the claim failed is given back
		if a.err == nil && a.v.Code == rediskit.BeginClaimed && !claimed {
			s.finishNodes(context.Background(), key, tok, rediskit.GiveBack, time.Millisecond, nil, []int{a.node}, 0)
		}
	})
	return b
}

// finishNodes runs op for tok on the nodes in idx and waits for every
// node (or the timeout), so that a completion reaches as many as it can.
// The record keeps the fence floor on each node (a claim's fence: see
// fenceOf; 0 for a claim never granted).
func (s *Store) finishNodes(ctx context.Context, key idemdriver.Key, tok string, op rediskit.FinishOp, d time.Duration, result []byte, idx []int, floor uint64) vote {
	return s.poll(ctx, idx, s.nodeTimeout(max(d, time.Second)), true, func(ctx context.Context, n *node) (bool, error) {
		return s.base.Finish(ctx, n.c, key, tok, op, d, result, floor)
	})
}

func (s *Store) finishClaim(ctx context.Context, c idemdriver.Claim, op rediskit.FinishOp, d time.Duration, result []byte) error {
	ctx, cancel, err := rediskit.FinishContext(ctx, c, op, "redlockstore")
	if err != nil {
		return err
	}
	defer cancel()
	v := s.finishNodes(ctx, c.Key, c.Token, op, d, result, s.all(), c.Fence)
	return s.verdict(string(op), c.Key.String(), v, lock.ErrLockLost)
}

// WaitChange implements idemdriver.Waiter: a completion or abandonment message
// from any node wakes the waiter, as does the lease's end. Close wakes it
// with lock.ErrClosed.
func (s *Store) WaitChange(ctx context.Context, key idemdriver.Key, until time.Time) error {
	select {
	case <-s.closed:
		return fmt.Errorf("redlockstore: wait for %q: %w", key, lock.ErrClosed)
	default:
	}
	mw := s.watchChannels(s.all(), s.base.Records.Channel(key))
	defer mw.close()
	// Look once more: the record may have changed before the subscription.
	if st, err := s.peek(ctx, key); err != nil || st != "i" {
		return nil
	}
	t := time.NewTimer(max(time.Until(until), 0) + time.Millisecond)
	defer t.Stop()
	select {
	case <-mw.wake:
	case <-t.C:
	case <-s.closed:
		return fmt.Errorf("redlockstore: wait for %q: %w", key, lock.ErrClosed)
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// peek reads the record's state on every node at once (which flags an
// in-flight record on each, so that whichever node completes announces
// it) and returns what it found: "c" when any node has the completed
// record, else "i" when any has it in flight.
func (s *Store) peek(ctx context.Context, key idemdriver.Key) (string, error) {
	r := newRound(s, s.all(), func(ctx context.Context, n *node) (string, error) {
		return s.base.RecordStatus(ctx, n.c, key)
	})
	var st string
	err := r.collect(ctx, s.nodeTimeout(time.Second), func(a answer[string]) bool {
		if a.err == nil && (a.v == "c" || st == "") {
			st = a.v
		}
		return st == "c"
	})
	if st == "" {
		return "", err
	}
	return st, nil
}

// Complete implements idemdriver.Store: the result is stored if c still holds
// the key on a majority of the nodes (else lock.ErrLockLost).
func (s *Store) Complete(ctx context.Context, c idemdriver.Claim, result []byte, retention time.Duration) error {
	return s.fin.Complete(ctx, c, result, retention)
}

// Abandon implements idemdriver.Store: c's in-flight record is deleted on the
// nodes so that a retry can run (else lock.ErrLockLost).
func (s *Store) Abandon(ctx context.Context, c idemdriver.Claim) error { return s.fin.Abandon(ctx, c) }

// Extend implements idemdriver.Store: c's lease is lengthened to lease from now
// on a majority of the nodes (else lock.ErrLockLost).
func (s *Store) Extend(ctx context.Context, c idemdriver.Claim, ttl time.Duration) error {
	return s.fin.Extend(ctx, c, ttl)
}
