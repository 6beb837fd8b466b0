package memstore

import (
	"context"
	"time"

	"github.com/oncekit/oncekit/stock/stockdriver"
)

// stockItem is one item's stock: its level, every key's record, and the
// records still held (the ones whose end is to be looked for).
type stockItem struct {
	exists  bool
	level   stockdriver.Level
	records map[string]*stockdriver.Record
	held    map[string]*stockdriver.Record
	calls   int // since the records were last swept for forgotten ones
}

// ApplyStock implements stockdriver.Store (package stock): the item's
// level and records live in this process, under the Store's lock.
func (s *Store) ApplyStock(ctx context.Context, item string, ops []stockdriver.Op) (stockdriver.Answer, error) {
	if err := ctx.Err(); err != nil {
		return stockdriver.Answer{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return stockdriver.Answer{}, closedErr("stock", item)
	}
	now := time.Now().UnixMilli()
	si := s.items[item]
	if si == nil {
		si = &stockItem{records: make(map[string]*stockdriver.Record), held: make(map[string]*stockdriver.Record)}
	}
	si.forget(now)
	view := stockdriver.Item{Exists: si.exists, Level: si.level, Records: make(map[string]*stockdriver.Record, len(ops))}
	for k, r := range si.held {
		if r.Deadline <= now {
			view.Records[k] = r
		}
	}
	for _, op := range ops {
		if r := si.records[op.Key]; r != nil && r.Until > now {
			view.Records[op.Key] = r
		}
	}
	a := stockdriver.Apply(now, &view, ops)
	if !view.Exists {
		return a, nil
	}
	si.exists, si.level = true, view.Level
	for k, r := range view.Records {
		if !r.Changed {
			continue
		}
		r.Changed = false
		si.records[k] = r
		if r.State == stockdriver.Held {
			si.held[k] = r
		} else {
			delete(si.held, k)
		}
	}
	if s.items == nil {
		s.items = make(map[string]*stockItem)
	}
	s.items[item] = si
	return a, nil
}

// forget drops, now and then, the records whose memory has passed (a
// record is looked up only while it is remembered either way).
func (si *stockItem) forget(now int64) {
	si.calls++
	if si.calls < 1024 && si.calls < len(si.records) {
		return
	}
	si.calls = 0
	for k, r := range si.records {
		if r.Until <= now && r.State != stockdriver.Held {
			delete(si.records, k)
		}
	}
}

var _ stockdriver.Store = (*Store)(nil)
