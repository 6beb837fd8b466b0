package zkstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/stock/stockdriver"
)

// ApplyStock implements stockdriver.Store (package stock). An item is a
// persistent znode, "<root>/stock/<escaped item>", whose data is
// "S1|<put>|<free>|<held>|<sold>" followed by "|<escaped key>/<deadline>/<units>"
// for each live hold (a hold's end, in ms by the ensemble's clock), and
// each key's record is its child, "S1|<t or h>|<state>|<units>|<deadline>|<keep>|<until>".
// A call reads the ensemble's clock (a write to "<root>/clock", stamped by
// the leader), the item and the records it needs, applies the operations
// (stockdriver.Apply) and writes them in one multi-operation transaction
// conditional on the item's version, and starts over if another call came
// between. A hold's end is judged by the leader's clock; after a leader
// change, by the new leader's. Cleanup (WithCleanup) deletes records
// whose memory has passed, never a live hold.
func (s *Store) ApplyStock(ctx context.Context, item string, ops []stockdriver.Op) (stockdriver.Answer, error) {
	if s.isClosed() {
		return stockdriver.Answer{}, fmt.Errorf("zkstore: stock %q: %w", item, lock.ErrClosed)
	}
	for attempt := 0; ; attempt++ {
		a, done, err := s.applyStock(ctx, item, ops)
		if err != nil {
			return stockdriver.Answer{}, fmt.Errorf("zkstore: stock %q: %w", item, err)
		}
		if done {
			return a, nil
		}
		if err := ctx.Err(); err != nil {
			return stockdriver.Answer{}, fmt.Errorf("zkstore: stock %q: %w", item, err)
		}
		time.Sleep(time.Duration(rand.Int64N(int64(time.Millisecond) << min(attempt, 6))))
	}
}

func (s *Store) stockRoot() string                   { return s.root + "/stock" }
func (s *Store) stockItem(item string) string        { return s.stockRoot() + "/" + escape(item) }
func (s *Store) stockRecord(item, key string) string { return s.stockItem(item) + "/" + escape(key) }

// stockRead is one record as read: nil data for none.
type stockRead struct {
	rec     *stockdriver.Record
	version int32
	exists  bool
}

func (s *Store) applyStock(ctx context.Context, item string, ops []stockdriver.Op) (stockdriver.Answer, bool, error) {
	now, err := s.serverNow(ctx)
	if err != nil {
		return stockdriver.Answer{}, false, err
	}
	data, st, err := s.get(ctx, s.stockItem(item))
	it := stockdriver.Item{Records: map[string]*stockdriver.Record{}}
	holds := map[string]stockHold{}
	switch {
	case errors.Is(err, zk.ErrNoNode):
	case err != nil:
		return stockdriver.Answer{}, false, err
	default:
		it.Exists = true
		var due []string
		if due, err = decodeStockItem(data, now.ms, &it, holds); err != nil {
			return stockdriver.Answer{}, false, fmt.Errorf("item %q: %w", item, err)
		}
		// The records to read: the ops' keys', and the holds' that ended.
		want := append([]string(nil), due...)
		for _, op := range ops {
			if op.Kind != stockdriver.Add && op.Kind != stockdriver.Set {
				want = append(want, op.Key)
			}
		}
		reads, err := s.readStockRecords(ctx, item, want)
		if err != nil {
			return stockdriver.Answer{}, false, err
		}
		for k, r := range reads {
			if r.exists && (r.rec.State == stockdriver.Held || r.rec.Until > now.ms) {
				it.Records[k] = r.rec
			}
		}
		for _, k := range due {
			if r := it.Records[k]; r == nil || r.State != stockdriver.Held {
				// The item lists a hold whose record is gone or no longer
				// holds: the item's list is what counts, so that its units
				// come back.
				h := holds[k]
				it.Records[k] = &stockdriver.Record{Key: k, Kind: stockdriver.Hold, State: stockdriver.Held, Units: h.units, Deadline: h.deadline}
			}
		}
		a := stockdriver.Apply(now.ms, &it, ops)
		done, err := s.writeStock(ctx, item, &it, holds, data, st.Version, reads)
		return a, done, err
	}
	a := stockdriver.Apply(now.ms, &it, ops)
	if !it.Exists {
		return a, true, nil
	}
	// An item's first Put or Add: its node.
	if err := s.ensure(ctx, s.stockRoot()); err != nil {
		return a, false, err
	}
	_, err = call(ctx, s, func() (string, error) {
		return s.conn.Create(s.stockItem(item), encodeStockItem(&it, holds), 0, zk.WorldACL(zk.PermAll))
	}, nil)
	if errors.Is(err, zk.ErrNodeExists) {
		return a, false, nil
	}
	return a, err == nil, err
}

// stockHold is a live hold as the item's data lists it.
type stockHold struct{ deadline, units int64 }

// decodeStockItem reads an item's data into it and holds (the live holds
// by key), and returns the keys whose hold ended by now.
func decodeStockItem(data []byte, now int64, it *stockdriver.Item, holds map[string]stockHold) ([]string, error) {
	f := strings.Split(string(data), "|")
	if len(f) < 5 || f[0] != "S1" {
		return nil, stockdriver.ErrUnknownLayout
	}
	var n [4]int64
	for i := range n {
		v, err := strconv.ParseInt(f[1+i], 10, 64)
		if err != nil {
			return nil, stockdriver.ErrUnknownLayout
		}
		n[i] = v
	}
	it.Put, it.Free, it.Held, it.Sold = n[0], n[1], n[2], n[3]
	var due []string
	for _, h := range f[5:] {
		parts := strings.Split(h, "/")
		if len(parts) != 3 {
			return nil, stockdriver.ErrUnknownLayout
		}
		k, ok := unescape(parts[0])
		deadline, err := strconv.ParseInt(parts[1], 10, 64)
		units, err2 := strconv.ParseInt(parts[2], 10, 64)
		if !ok || err != nil || err2 != nil {
			return nil, stockdriver.ErrUnknownLayout
		}
		holds[k] = stockHold{deadline, units}
		if deadline <= now {
			due = append(due, k)
		}
	}
	return due, nil
}

// encodeStockItem is it's data: its level, and its live holds in key
// order — those it read (holds) as Apply left the records it read.
func encodeStockItem(it *stockdriver.Item, holds map[string]stockHold) []byte {
	for k, r := range it.Records {
		if r.State == stockdriver.Held {
			holds[k] = stockHold{r.Deadline, r.Units}
		} else {
			delete(holds, k)
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "S1|%d|%d|%d|%d", it.Put, it.Free, it.Held, it.Sold)
	keys := make([]string, 0, len(holds))
	for k := range holds {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "|%s/%d/%d", escape(k), holds[k].deadline, holds[k].units)
	}
	return []byte(b.String())
}

// readStockRecords reads the records of keys at once.
func (s *Store) readStockRecords(ctx context.Context, item string, keys []string) (map[string]stockRead, error) {
	out := make(map[string]stockRead, len(keys))
	var mu sync.Mutex
	var wg sync.WaitGroup
	var first error
	distinct := make(map[string]bool, len(keys))
	for _, k := range keys {
		distinct[k] = true
	}
	for k := range distinct {
		wg.Go(func() {
			data, st, err := s.get(ctx, s.stockRecord(item, k))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case errors.Is(err, zk.ErrNoNode):
			case err != nil:
				first = errors.Join(first, err)
			default:
				r, derr := decodeStockRecord(k, data)
				if derr != nil {
					first = errors.Join(first, derr)
					return
				}
				out[k] = stockRead{rec: r, version: st.Version, exists: true}
			}
		})
	}
	wg.Wait()
	return out, first
}

func decodeStockRecord(key string, b []byte) (*stockdriver.Record, error) {
	f := strings.Split(string(b), "|")
	if len(f) != 7 || f[0] != "S1" || (f[1] != "t" && f[1] != "h") {
		return nil, fmt.Errorf("record of %q: %w", key, stockdriver.ErrUnknownLayout)
	}
	var n [5]int64
	for i := range n {
		v, err := strconv.ParseInt(f[2+i], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("record of %q: %w", key, stockdriver.ErrUnknownLayout)
		}
		n[i] = v
	}
	if n[0] < int64(stockdriver.Sold) || n[0] > int64(stockdriver.Expired) {
		return nil, fmt.Errorf("record of %q: %w", key, stockdriver.ErrUnknownLayout)
	}
	kind := stockdriver.Take
	if f[1] == "h" {
		kind = stockdriver.Hold
	}
	return &stockdriver.Record{Key: key, Kind: kind, State: stockdriver.State(n[0]), Units: n[1], Deadline: n[2], Keep: n[3], Until: n[4]}, nil
}

func encodeStockRecord(r *stockdriver.Record) []byte {
	kind := "t"
	if r.Kind == stockdriver.Hold {
		kind = "h"
	}
	return fmt.Appendf(nil, "S1|%s|%d|%d|%d|%d|%d", kind, r.State, r.Units, r.Deadline, r.Keep, r.Until)
}

// writeStock writes the item and its changed records in one transaction,
// conditional on the item's version; false when another call came
// between.
func (s *Store) writeStock(ctx context.Context, item string, it *stockdriver.Item, holds map[string]stockHold, old []byte, version int32, reads map[string]stockRead) (bool, error) {
	data := encodeStockItem(it, holds)
	ops := []any{&zk.SetDataRequest{Path: s.stockItem(item), Data: data, Version: version}}
	for k, r := range it.Records {
		if !r.Changed {
			continue
		}
		path := s.stockRecord(item, k)
		if rd := reads[k]; rd.exists {
			ops = append(ops, &zk.SetDataRequest{Path: path, Data: encodeStockRecord(r), Version: rd.version})
		} else {
			ops = append(ops, &zk.CreateRequest{Path: path, Data: encodeStockRecord(r), Acl: zk.WorldACL(zk.PermAll)})
		}
	}
	if len(ops) == 1 && string(data) == string(old) {
		return true, nil // nothing changed: a read, or replays only
	}
	_, err := call(ctx, s, func() ([]zk.MultiResponse, error) { return s.conn.Multi(ops...) }, nil)
	if errors.Is(err, zk.ErrBadVersion) || errors.Is(err, zk.ErrNodeExists) || errors.Is(err, zk.ErrNoNode) {
		return false, nil
	}
	return err == nil, err
}

// cleanupStock deletes the stock records whose memory has passed by now
// (never one that holds), and returns how many.
func (s *Store) cleanupStock(ctx context.Context, now serverClock) (int, error) {
	items, err := call(ctx, s, func() ([]string, error) {
		kids, _, err := s.conn.Children(s.stockRoot())
		return kids, err
	}, nil)
	if errors.Is(err, zk.ErrNoNode) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	deleted := 0
	for _, it := range items {
		dir := s.stockRoot() + "/" + it
		kids, err := call(ctx, s, func() ([]string, error) {
			kids, _, err := s.conn.Children(dir)
			return kids, err
		}, nil)
		if err != nil {
			continue
		}
		for _, k := range kids {
			path := dir + "/" + k
			data, st, err := s.get(ctx, path)
			if err != nil {
				continue
			}
			r, err := decodeStockRecord(k, data)
			if err != nil || r.State == stockdriver.Held || r.Until > now.ms {
				continue
			}
			if _, err := call(ctx, s, func() (struct{}, error) { return struct{}{}, s.conn.Delete(path, st.Version) }, nil); err == nil {
				deleted++
			}
		}
		if err := ctx.Err(); err != nil {
			return deleted, err
		}
	}
	return deleted, nil
}

var _ stockdriver.Store = (*Store)(nil)
