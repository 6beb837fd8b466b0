package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
)

// Concurrent claims and completions of one Store share statements
// (PostgreSQL with pgx). On a busy service most of the database's work per
// request is not the row it writes but the statement around it: a round
// trip that wakes a sleeping backend, a parse-bind-execute, a commit. A
// claim or completion sent while maxFlushers of its kind are already in
// flight waits for the next one to go out, and that one carries every
// call queued by then as one multi-row statement (unnest of arrays), one
// commit for them all. Alone, a call goes out at once, as its own
// single-row statement: nothing waits that did not have to.
//
// Each call keeps its own outcome: a claim that met a row (a duplicate, a
// replay, a key taken before) is not taken by the batch and goes on alone,
// as it would have; a completion whose claim is no longer the record's is
// not applied. The rows are written in key order, so two batches never
// wait for each other's rows in opposite orders.

// maxFlushers is how many statements of one kind (claims, completions) a
// Store has in flight before calls queue for the next.
const maxFlushers = 4

// maxBatch bounds the rows of one statement, and maxBatchBytes the size
// of its arguments (results of up to WithMaxResultBytes each): a call that
// would take a statement past it waits for the next one, which it may
// fill alone.
const (
	maxBatch      = 256
	maxBatchBytes = 1 << 20
)

// batcher runs calls of one statement alone or together (see above).
type batcher[A, R any] struct {
	s    *Store
	one  func(ctx context.Context, a A) (R, error)
	many func(ctx context.Context, calls []*batchCall[A, R]) error // sets each call's res and err; an error is every call's
	size func(A) int                                               // the bytes a call adds to a statement

	mu       sync.Mutex
	queue    []*batchCall[A, R]
	flushers int
	batches  atomic.Int64 // statements sent for more than one call
}

type batchCall[A, R any] struct {
	ctx  context.Context
	arg  A
	res  R
	err  error
	done chan struct{}
	left atomic.Bool // the caller stopped waiting before the call was sent
}

// do runs a's call and returns its outcome, or ctx's error once ctx ends
// (a call already sent may still be applied: the caller treats that as a
// lost answer, as for a statement of its own).
func (b *batcher[A, R]) do(ctx context.Context, a A) (R, error) {
	b.mu.Lock()
	if b.flushers < maxFlushers && len(b.queue) == 0 {
		b.flushers++
		b.mu.Unlock()
		r, err := b.one(ctx, a)
		b.mu.Lock()
		b.flushers--
		b.startLocked()
		b.mu.Unlock()
		return r, err
	}
	c := &batchCall[A, R]{ctx: ctx, arg: a, done: make(chan struct{})}
	b.queue = append(b.queue, c)
	b.startLocked()
	b.mu.Unlock()
	select {
	case <-c.done:
		return c.res, c.err
	case <-ctx.Done():
		c.left.Store(true)
		var zero R
		return zero, ctx.Err()
	}
}

// startLocked starts a flusher when calls wait and a slot is free. Close
// waits for it before it closes the Store's database; one started after
// Close still answers the calls queued (with the database's error).
func (b *batcher[A, R]) startLocked() {
	if len(b.queue) > 0 && b.flushers < maxFlushers {
		b.flushers++
		done, _ := b.s.holdOpen()
		go b.flush(done)
	}
}

// flush sends what is queued, batch after batch, until the queue is
// empty, then calls done (when not nil).
func (b *batcher[A, R]) flush(done func()) {
	if done != nil {
		defer done()
	}
	for {
		b.mu.Lock()
		if len(b.queue) == 0 {
			b.flushers--
			b.mu.Unlock()
			return
		}
		n, bytes := 1, b.size(b.queue[0].arg)
		for n < len(b.queue) && n < maxBatch {
			if bytes += b.size(b.queue[n].arg); bytes > maxBatchBytes {
				break
			}
			n++
		}
		calls := b.queue[:n:n]
		b.queue = b.queue[n:]
		if len(b.queue) == 0 {
			b.queue = nil
		}
		b.mu.Unlock()
		b.send(calls)
	}
}

// send runs calls (those whose callers still wait) as one statement, or
// alone when one is left. The statement's context ends when every caller
// that can stop waiting has.
func (b *batcher[A, R]) send(calls []*batchCall[A, R]) {
	live := calls[:0:0]
	for _, c := range calls {
		if !c.left.Load() {
			live = append(live, c)
		}
	}
	defer func() {
		for _, c := range calls {
			close(c.done)
		}
	}()
	switch len(live) {
	case 0:
		return
	case 1:
		c := live[0]
		c.res, c.err = b.one(c.ctx, c.arg)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var waiting atomic.Int64
	waiting.Store(int64(len(live)))
	for _, c := range live {
		stop := context.AfterFunc(c.ctx, func() {
			if waiting.Add(-1) == 0 {
				cancel()
			}
		})
		defer stop()
	}
	b.batches.Add(1)
	if err := b.many(ctx, live); err != nil {
		for _, c := range live {
			c.err = err
		}
	}
}

// pgxQuery runs query on one of the pool's pgx connections and calls each
// for every row.
func (s *Store) pgxQuery(ctx context.Context, query string, args []any, each func(pgx.Rows) error) error {
	c, err := s.db.Conn(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	return c.Raw(func(dc any) error {
		pc, ok := dc.(*stdlib.Conn)
		if !ok {
			return errors.New("sqlstore: not a pgx connection")
		}
		rows, err := pc.Conn().Query(ctx, query, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			if err := each(rows); err != nil {
				return err
			}
		}
		return rows.Err()
	})
}

// beginArg is a claim of a key never seen lately (leanBegin).
type beginArg struct {
	key, fp      []byte
	tok          string
	lease, sweep int64
}

// beginRes is the claim's fence and attempt.
type beginRes struct{ fence, attempt int64 }

func (s *Store) leanBeginOne(ctx context.Context, a beginArg) (beginRes, error) {
	var r beginRes
	err := s.queryRow(ctx, s.q.leanBegin, a.key, a.fp, a.tok, a.lease, a.sweep).Scan(&r.fence, &r.attempt)
	return r, err
}

// leanBeginMany claims the calls' keys in one statement; a call whose key
// had a row gets sql.ErrNoRows, as from leanBegin.
func (s *Store) leanBeginMany(ctx context.Context, calls []*batchCall[beginArg, beginRes]) error {
	n := len(calls)
	keys, fps, toks, leases, sweeps := make([][]byte, n), make([][]byte, n), make([]string, n), make([]int64, n), make([]int64, n)
	byTok := make(map[string]*batchCall[beginArg, beginRes], n)
	for i, c := range calls {
		keys[i], fps[i], toks[i], leases[i], sweeps[i] = c.arg.key, c.arg.fp, c.arg.tok, c.arg.lease, c.arg.sweep
		byTok[c.arg.tok] = c
		c.err = sql.ErrNoRows
	}
	return s.pgxQuery(ctx, s.q.leanBeginMany, []any{keys, fps, toks, leases, sweeps}, func(rows pgx.Rows) error {
		var tok string
		var r beginRes
		if err := rows.Scan(&tok, &r.fence, &r.attempt); err != nil {
			return err
		}
		if c := byTok[tok]; c != nil {
			c.res, c.err = r, nil
		}
		return nil
	})
}

// completeArg is the completion of an in-flight claim (fastComplete).
type completeArg struct {
	key       []byte
	tok       string
	retention int64
	result    []byte
}

func (s *Store) fastCompleteOne(ctx context.Context, a completeArg) (watched bool, err error) {
	err = s.queryRow(ctx, s.q.fastComplete, a.retention, a.result, a.key, a.tok).Scan(&watched)
	return watched, err
}

// fastCompleteMany completes the calls' claims in one statement; a call
// whose claim is no longer the record's gets sql.ErrNoRows, as from
// fastComplete. A call's result is true when its record is watched and
// the batch could not notify for it.
func (s *Store) fastCompleteMany(ctx context.Context, calls []*batchCall[completeArg, bool]) error {
	n := len(calls)
	keys, toks, rets, results := make([][]byte, n), make([]string, n), make([]int64, n), make([][]byte, n)
	byTok := make(map[string]*batchCall[completeArg, bool], n)
	for i, c := range calls {
		keys[i], toks[i], rets[i], results[i] = c.arg.key, c.arg.tok, c.arg.retention, c.arg.result
		byTok[c.arg.tok] = c
		c.err = sql.ErrNoRows
	}
	var watched []*batchCall[completeArg, bool]
	err := s.pgxQuery(ctx, s.q.fastCompleteMany, []any{keys, toks, rets, results}, func(rows pgx.Rows) error {
		var tok string
		var w bool
		if err := rows.Scan(&tok, &w); err != nil {
			return err
		}
		if c := byTok[tok]; c != nil {
			c.res, c.err = w, nil
			if w {
				watched = append(watched, c)
			}
		}
		return nil
	})
	if err != nil || len(watched) == 0 {
		return err
	}
	// Duplicates in other processes wait for some of the records: one
	// statement tells them all (best effort, as fastComplete's caller's
	// own notification: a duplicate looks again within its poll). A call
	// left true notifies by itself.
	_, _, records := s.Tables()
	hashes := make([]string, len(watched))
	for i, c := range watched {
		hashes[i] = keyHash(string(c.arg.key))
	}
	if s.pgxQuery(ctx, s.q.notifyMany, []any{records, hashes}, func(pgx.Rows) error { return nil }) == nil {
		for _, c := range watched {
			c.res = false
		}
	}
	return nil
}

// recordOne reads key's record (recSelect); sql.ErrNoRows when it has
// none.
func (s *Store) recordOne(ctx context.Context, key []byte) (recordRow, error) {
	var r recordRow
	err := s.queryRow(ctx, s.q.recSelect, key).Scan(&r.state, &r.fp, &r.token, &r.fence, &r.expires, &r.result, &r.attempt, &r.now)
	r.found = err == nil
	return r, err
}

// recordMany reads the calls' records in one statement; a call whose key
// has none gets sql.ErrNoRows.
func (s *Store) recordMany(ctx context.Context, calls []*batchCall[[]byte, recordRow]) error {
	keys := make([][]byte, len(calls))
	byKey := make(map[string][]*batchCall[[]byte, recordRow], len(calls))
	for i, c := range calls {
		keys[i] = c.arg
		byKey[string(c.arg)] = append(byKey[string(c.arg)], c)
		c.err = sql.ErrNoRows
	}
	return s.pgxQuery(ctx, s.q.recSelectMany, []any{keys}, func(rows pgx.Rows) error {
		var key []byte
		var r recordRow
		if err := rows.Scan(&key, &r.state, &r.fp, &r.token, &r.fence, &r.expires, &r.result, &r.attempt, &r.now); err != nil {
			return err
		}
		r.found = true
		for _, c := range byKey[string(key)] {
			c.res, c.err = r, nil
		}
		return nil
	})
}
