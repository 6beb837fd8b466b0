package redlockstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/internal/redislua"
	"github.com/oncekit/oncekit/internal/token"
)

// Idempotency records (idem.Store) on N independent nodes. Each node keeps
// the same record as redisstore does (a versioned hash with the claim's
// token, a fence counter, a completion channel). A claim is begun on every
// node at once and holds only with a majority; a completed record found on
// any node wins over everything else; Complete, Abandon and Extend go to
// every node and need a majority. A claim's fence is the highest of the
// acquired nodes' counters (without the lock's second fencing round).

func (s *Store) records() redislua.Records { return redislua.Records{Prefix: s.opts.recordPrefix} }

// Begin implements idem.Store: one round to every node at once.
func (s *Store) Begin(ctx context.Context, key, fingerprint string, lease time.Duration) (idem.Claim, error) {
	if err := lock.Validate(key, lease); err != nil {
		return idem.Claim{}, err
	}
	tok := token.New()
	now := time.Now()
	n := len(s.nodes)
	results := make([][]byte, n)
	reasons := make([]string, n)
	ch := s.call(s.all(), func(cx context.Context, nd *node) ([]int64, error) {
		r, err := redislua.ParseBegin(redislua.IdemBegin.Run(cx, nd.c,
			[]string{s.records().Record(key), s.records().Fence(key)}, fingerprint, tok, lease.Milliseconds()))
		if err != nil {
			return nil, err
		}
		i := slices.Index(s.nodes, nd)
		results[i], reasons[i] = r.Result, r.Reason
		return []int64{r.Code, r.N}, nil
	})
	var (
		acquired = map[int]int64{}
		counts   = map[int64]int{}
		failed   = map[int]error{}
		done     = -1 // a node with the completed record
		corrupt  = -1
		pttl     int64
		answered = make([]bool, n)
		nAnswer  = 0
	)
	pending, timedOut, ctxErr := collect(ctx, ch, n, s.nodeTimeout(lease), func(r reply) bool {
		answered[r.i] = true
		nAnswer++
		if r.err != nil {
			failed[r.i] = r.err
			return len(failed) > n-s.quorum
		}
		counts[r.v[0]]++
		switch r.v[0] {
		case 1:
			acquired[r.i] = r.v[1]
		case 3:
			done = r.i
		case -2:
			corrupt = r.i
		default:
			pttl = max(pttl, r.v[1])
		}
		// A completed or corrupt record decides at once. Otherwise wait for
		// a majority of claims, or for a majority of answers once a claim
		// is out of reach (a completed record lives on a majority, so any
		// majority of answers includes it).
		return done >= 0 || corrupt >= 0 || len(acquired) >= s.quorum ||
			(nAnswer >= s.quorum && len(acquired)+n-nAnswer < s.quorum)
	})
	if timedOut {
		for i := range n {
			if !answered[i] {
				failed[i] = errNodeTimeout
			}
		}
	}
	claimed := func() bool { return len(acquired) >= s.quorum && done < 0 && corrupt < 0 && ctxErr == nil }()
	if pending > 0 { // late answers: a node taken after the claim failed is given back
		s.bg.Go(func() {
			for range pending {
				if r := <-ch; r.err == nil && r.v[0] == 1 && !claimed {
					s.finishNodes(context.Background(), key, tok, "abandon", time.Millisecond, nil, []int{r.i})
				}
			}
		})
	}
	if !claimed && len(acquired) > 0 {
		s.finishNodes(ctx, key, tok, "abandon", time.Millisecond, nil, indexes(acquired))
	}
	c := idem.Claim{Key: key, Fingerprint: fingerprint, Expires: now.Add(time.Duration(pttl) * time.Millisecond)}
	switch {
	case corrupt >= 0:
		return idem.Claim{}, &idem.CorruptRecordError{Key: key, Reason: s.nodes[corrupt].name + ": " + reasons[corrupt]}
	case done >= 0:
		c.State, c.Result = idem.Completed, results[done]
		return c, nil
	case ctxErr != nil:
		return idem.Claim{}, ctxErr
	case claimed:
		var fence int64
		for _, f := range acquired {
			fence = max(fence, f)
		}
		c.State, c.Token, c.Fence, c.Expires = idem.Acquired, tok, uint64(fence), now.Add(lease)
		return c, nil
	case counts[4] > 0:
		c.State = idem.Mismatch
		return c, nil
	case counts[2] > 0 || len(acquired) > 0:
		c.State = idem.InFlight
		return c, nil
	default:
		return idem.Claim{}, s.quorumError("begin", key, len(acquired), failed)
	}
}

// finishNodes runs the finish script for tok on the nodes in idx and
// counts how many were ours.
func (s *Store) finishNodes(ctx context.Context, key, tok, op string, d time.Duration, result []byte, idx []int) (ok, notOurs int, failed map[int]error, ctxErr error) {
	ch := s.call(idx, func(cx context.Context, nd *node) ([]int64, error) {
		v, err := redislua.IdemFinish.Run(cx, nd.c, []string{s.records().Record(key)},
			tok, op, d.Milliseconds(), result, s.records().Channel(key), s.opts.pubsub.ScriptArg()).Int64()
		return []int64{v}, err
	})
	failed = map[int]error{}
	answered := map[int]bool{}
	_, timedOut, ctxErr := collect(ctx, ch, len(idx), s.nodeTimeout(max(d, time.Second)), func(r reply) bool {
		answered[r.i] = true
		switch {
		case r.err != nil:
			failed[r.i] = r.err
		case r.v[0] == 1:
			ok++
		default:
			notOurs++
		}
		return ok+notOurs+len(failed) == len(idx)
	})
	if timedOut {
		for _, i := range idx {
			if !answered[i] {
				failed[i] = errNodeTimeout
			}
		}
	}
	return ok, notOurs, failed, ctxErr
}

func (s *Store) finishClaim(ctx context.Context, c idem.Claim, op string, d time.Duration, result []byte) error {
	if c.Token == "" {
		return fmt.Errorf("redlockstore: %s %q: %w", op, c.Key, idem.ErrLockLost)
	}
	if ctx.Err() != nil && op != "extend" {
		var cancel context.CancelFunc
		ctx, cancel = lock.CleanupContext(ctx)
		defer cancel()
	}
	ok, notOurs, failed, ctxErr := s.finishNodes(ctx, c.Key, c.Token, op, d, result, s.all())
	n := len(s.nodes)
	switch {
	case ok >= s.quorum:
		return nil
	case ctxErr != nil:
		return fmt.Errorf("redlockstore: %s %q: %w", op, c.Key, ctxErr)
	case notOurs > n-s.quorum:
		return fmt.Errorf("redlockstore: %s %q: %w", op, c.Key, idem.ErrLockLost)
	default:
		return s.quorumError(op, c.Key, ok, failed)
	}
}

// Complete implements idem.Store: every node at once, a majority needed.
func (s *Store) Complete(ctx context.Context, c idem.Claim, result []byte, retention time.Duration) error {
	if err := lock.ValidateTTL(retention); err != nil {
		return err
	}
	return s.finishClaim(ctx, c, "complete", retention, result)
}

// Abandon implements idem.Store.
func (s *Store) Abandon(ctx context.Context, c idem.Claim) error {
	return s.finishClaim(ctx, c, "abandon", time.Millisecond, nil)
}

// Extend implements idem.Store.
func (s *Store) Extend(ctx context.Context, c idem.Claim, lease time.Duration) error {
	if err := lock.ValidateTTL(lease); err != nil {
		return err
	}
	return s.finishClaim(ctx, c, "extend", lease, nil)
}

// WaitChange implements idem.Waiter: a completion or abandonment message
// from any node wakes the waiter, as does the lease's end.
func (s *Store) WaitChange(ctx context.Context, key string, until time.Time) error {
	mw := s.watchChannels(s.records().Channel(key))
	defer mw.close()
	// Look once more: the record may have changed before the subscription.
	c, err := s.peek(ctx, key)
	if err != nil || c != 'i' {
		return nil
	}
	t := time.NewTimer(max(time.Until(until), 0) + time.Millisecond)
	defer t.Stop()
	select {
	case <-mw.wake:
	case <-t.C:
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// peek reads the record's state on the first node that answers.
func (s *Store) peek(ctx context.Context, key string) (byte, error) {
	var errs []error
	for _, nd := range s.nodes {
		v, err := nd.c.Eval(ctx, "return redis.call('HGET', KEYS[1], 's')", []string{s.records().Record(key)}).Text()
		if err == nil && len(v) > 0 {
			return v[0], nil
		}
		errs = append(errs, err)
	}
	return 0, errors.Join(errs...)
}

var (
	_ idem.Store  = (*Store)(nil)
	_ idem.Waiter = (*Store)(nil)
)
