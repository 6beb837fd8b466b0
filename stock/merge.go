package stock

import (
	"context"
	"runtime"
	"sync"
	"time"

	"github.com/oncekit/oncekit/core/observe"
	"github.com/oncekit/oncekit/stock/stockdriver"
)

// merger merges the concurrent operations on one item into store calls:
// while one call for an item is in flight, the operations that arrive
// queue, and the first of them sends the next call with up to maxMerge of
// them. One process so has at most one call in flight per item, and the
// store orders the calls of all processes.
//
// The next call's sender yields once before it gathers its batch: the
// callers the last call just answered are ready to run, and those that
// come straight back with another operation (a worker's loop, a consumer's
// next message) join this call instead of waiting for the one after it.
// Without the yield the batches alternate between those that arrived
// during a call and those that came back after it, half the size they
// could be.
type merger struct {
	s     *Stock
	mu    sync.Mutex
	items map[string]*queue
}

// queue is one item's operations waiting for a call.
type queue struct {
	busy    bool // a call for the item is in flight or being sent
	pending []*pending
}

// pending is one operation waiting for its answer. wake gets a value when
// the answer is in (done) or when the operation's caller is to send the
// next call.
type pending struct {
	ctx  context.Context
	op   stockdriver.Op
	wake chan struct{}
	sent bool // taken into a call

	done bool
	res  stockdriver.Result
	lvl  stockdriver.Level
	err  error
}

func (m *merger) init(s *Stock) {
	m.s = s
	m.items = make(map[string]*queue)
}

// do runs op on item and returns its answer.
func (m *merger) do(ctx context.Context, item string, op stockdriver.Op) (stockdriver.Result, stockdriver.Level, error) {
	p := &pending{ctx: ctx, op: op, wake: make(chan struct{}, 1)}
	m.mu.Lock()
	q := m.items[item]
	if q == nil {
		q = &queue{}
		m.items[item] = q
	}
	q.pending = append(q.pending, p)
	lead := !q.busy
	q.busy = true
	m.mu.Unlock()
	if !lead {
		select {
		case <-p.wake:
		case <-ctx.Done():
			if m.leave(item, q, p) {
				return stockdriver.Result{}, stockdriver.Level{}, context.Cause(ctx)
			}
			<-p.wake // taken into a call already: its answer comes
		}
		if p.done {
			return p.res, p.lvl, p.err
		}
	}
	m.send(item, q)
	return p.res, p.lvl, p.err
}

// leave takes p, whose caller gave up, out of q if no call has taken it
// yet, and reports whether it did. If p was to send the next call, the
// next operation sends it.
func (m *merger) leave(item string, q *queue, p *pending) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if p.sent {
		return false
	}
	select {
	case <-p.wake: // made the sender just now
		p.wake <- struct{}{}
		return false
	default:
	}
	for i, o := range q.pending {
		if o == p {
			q.pending = append(q.pending[:i], q.pending[i+1:]...)
			break
		}
	}
	return true
}

// send sends one call with the first pending operations of q (the caller's
// own is the first), answers them, and hands the sending of the next call
// to the first operation still pending, if any.
func (m *merger) send(item string, q *queue) {
	if w := m.s.mergeWait; w > 0 {
		time.Sleep(w)
	} else {
		runtime.Gosched()
	}
	m.mu.Lock()
	n := min(len(q.pending), m.s.maxMerge)
	batch := make([]*pending, n)
	copy(batch, q.pending)
	q.pending = append(q.pending[:0], q.pending[n:]...)
	for _, p := range batch {
		p.sent = true
	}
	m.mu.Unlock()

	m.call(item, batch)

	m.mu.Lock()
	if len(q.pending) == 0 {
		q.busy = false
		if m.items[item] == q {
			delete(m.items, item)
		}
	} else {
		q.pending[0].wake <- struct{}{}
	}
	m.mu.Unlock()
	for _, p := range batch[1:] {
		p.wake <- struct{}{}
	}
}

// call sends batch to the store and sets each operation's answer.
func (m *merger) call(item string, batch []*pending) {
	ops := make([]stockdriver.Op, len(batch))
	for i, p := range batch {
		ops[i] = p.op
	}
	ctx, cancel := m.context(batch)
	defer cancel()
	ctx, call := observe.Begin(ctx, m.s.observer, observe.StockApply, m.s.driver, item)
	call.Count(len(batch))
	a, err := m.s.store.ApplyStock(ctx, item, ops)
	if err == nil && len(a.Results) != len(ops) {
		err = errAnswers(len(a.Results), len(ops))
	}
	if err != nil {
		call.End(observe.Error, 0, err)
	} else {
		call.End(observe.OK, 0, nil)
		m.s.expired(ctx, item, a.Expired)
	}
	for i, p := range batch {
		p.done, p.err = true, err
		if err == nil {
			p.res, p.lvl = a.Results[i], a.Level
		}
	}
}

// context is the context of a call for batch: the one caller's own, or
// for several, one that no single caller's end cancels, bounded by the
// latest of their deadlines (WithTimeout when one has none).
func (m *merger) context(batch []*pending) (context.Context, context.CancelFunc) {
	if len(batch) == 1 {
		return batch[0].ctx, func() {}
	}
	var last time.Time
	for _, p := range batch {
		d, ok := p.ctx.Deadline()
		if !ok {
			last = time.Now().Add(m.s.timeout)
			break
		}
		last = maxTime(last, d)
	}
	return context.WithDeadline(context.WithoutCancel(batch[0].ctx), last)
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
