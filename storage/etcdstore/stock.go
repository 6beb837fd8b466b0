package etcdstore

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net/url"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/stock/stockdriver"
)

// ApplyStock implements stockdriver.Store (package stock). An item is
// three kinds of entries under <stock prefix><escaped item>/: the item
// itself, "i" ("S1|<put>|<sold>"), each live hold, "h/<key>" (its units,
// bound to a lease of the hold's TTL rounded up to whole seconds), and
// each key's record, "k/<key>" ("S1|<t or h>|<state>|<units>|<lease>|<keep ms>",
// bound to a lease that outlives its memory). Held units are the live
// holds': a hold ends when etcd revokes its lease, by the server's clock,
// whatever became of its holder. A call reads the item, its live holds
// and its keys' records in one transaction, applies the operations
// (stockdriver.Apply) and writes in one transaction conditional on none
// of them having changed, and starts over if one did.
func (s *Store) ApplyStock(ctx context.Context, item string, ops []stockdriver.Op) (stockdriver.Answer, error) {
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return stockdriver.Answer{}, fmt.Errorf("etcdstore: stock %q: %w", item, lock.ErrClosed)
	}
	holdLeases := map[time.Duration]clientv3.LeaseID{}
	for attempt := 0; ; attempt++ {
		a, done, err := s.applyStock(ctx, item, ops, holdLeases)
		if err != nil {
			return stockdriver.Answer{}, fmt.Errorf("etcdstore: stock %q: %w", item, err)
		}
		if done {
			return a, nil
		}
		if err := ctx.Err(); err != nil {
			return stockdriver.Answer{}, fmt.Errorf("etcdstore: stock %q: %w", item, err)
		}
		// Another process's call came between the read and the write.
		time.Sleep(time.Duration(rand.Int64N(int64(time.Millisecond) << min(attempt, 6))))
	}
}

// stockView is what a call read of an item.
type stockView struct {
	item      stockdriver.Item
	itemRev   int64                       // the item's mod revision (0: none)
	recRev    map[string]int64            // each op key's record's mod revision (0: none)
	holdRev   map[string]int64            // each live hold's create revision
	gone      map[string]bool             // records that say held whose hold has ended
	leases    map[string]clientv3.LeaseID // held records' hold leases
	liveUnits map[string]int64            // the live holds' units
}

func (s *Store) stockDir(item string) string { return s.opts.stockPrefix + url.PathEscape(item) + "/" }

func (s *Store) applyStock(ctx context.Context, item string, ops []stockdriver.Op, holdLeases map[time.Duration]clientv3.LeaseID) (stockdriver.Answer, bool, error) {
	dir := s.stockDir(item)
	v, err := s.readStock(ctx, dir, ops)
	if err != nil {
		return stockdriver.Answer{}, false, err
	}
	// A hold's end is etcd's (its lease): the records of holds that ended
	// are presented as held until now = 1, and Apply ends them.
	const now = 1
	a := stockdriver.Apply(now, &v.item, ops)
	if !v.item.Exists {
		return a, true, nil
	}
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(dir+"i"), "=", v.itemRev)}
	for k, rev := range v.recRev {
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(dir+"k/"+k), "=", rev))
	}
	puts := []clientv3.Op{clientv3.OpPut(dir+"i", fmt.Sprintf("S1|%d|%d", v.item.Put, v.item.Sold))}
	for k, r := range v.item.Records {
		if !r.Changed {
			continue
		}
		lease := v.leases[k]
		switch {
		case r.State == stockdriver.Held && v.liveUnits[k] == 0: // a new hold
			ttl := time.Duration(r.Deadline-now) * time.Millisecond
			id, ok := holdLeases[ttl]
			if !ok {
				g, err := s.c.Grant(ctx, int64(math.Ceil(ttl.Seconds())))
				if err != nil {
					return a, false, err
				}
				id = g.ID
				holdLeases[ttl] = id
			}
			lease = id
			puts = append(puts, clientv3.OpPut(dir+"h/"+k, strconv.FormatInt(r.Units, 10), clientv3.WithLease(id)))
		case r.State != stockdriver.Held && v.liveUnits[k] > 0: // confirmed or released
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(dir+"h/"+k), "=", v.holdRev[k]))
			puts = append(puts, clientv3.OpDelete(dir+"h/"+k))
		}
		memory := time.Duration(r.Keep) * time.Millisecond
		if r.State == stockdriver.Held {
			memory += time.Duration(r.Deadline-now) * time.Millisecond
		}
		rl, err := s.retentionLease(ctx, time.Now().Add(memory))
		if err != nil {
			return a, false, err
		}
		puts = append(puts, clientv3.OpPut(dir+"k/"+k, fmt.Sprintf("S1|%s|%d|%d|%d|%d", stockKinds[r.Kind], r.State, r.Units, lease, r.Keep), clientv3.WithLease(rl)))
	}
	if len(puts) == 1 && a.Level == v.item.Level && !changedLevel(ops) {
		return s.remaining(ctx, a, v, ops), true, nil // nothing to write: a read, or replays only
	}
	tr, err := s.c.Txn(ctx).If(cmps...).Then(puts...).Commit()
	if err != nil {
		return a, false, err
	}
	if !tr.Succeeded {
		return a, false, nil
	}
	return s.remaining(ctx, a, v, ops), true, nil
}

// changedLevel reports whether ops may change the item although no
// record changed (Add, Set).
func changedLevel(ops []stockdriver.Op) bool {
	for _, op := range ops {
		if op.Kind == stockdriver.Add || op.Kind == stockdriver.Set {
			return true
		}
	}
	return false
}

var stockKinds = map[stockdriver.Kind]string{stockdriver.Take: "t", stockdriver.Hold: "h"}

// readStock reads the item, its live holds and the records of ops' keys
// in one transaction.
func (s *Store) readStock(ctx context.Context, dir string, ops []stockdriver.Op) (stockView, error) {
	gets := []clientv3.Op{clientv3.OpGet(dir + "i"), clientv3.OpGet(dir+"h/", clientv3.WithPrefix())}
	var keys []string
	seen := map[string]bool{}
	for _, op := range ops {
		if op.Kind != stockdriver.Add && op.Kind != stockdriver.Set && !seen[op.Key] {
			seen[op.Key] = true
			keys = append(keys, op.Key)
			gets = append(gets, clientv3.OpGet(dir+"k/"+op.Key))
		}
	}
	tr, err := s.c.Txn(ctx).Then(gets...).Commit()
	if err != nil {
		return stockView{}, err
	}
	v := stockView{recRev: map[string]int64{}, holdRev: map[string]int64{}, gone: map[string]bool{},
		leases: map[string]clientv3.LeaseID{}, liveUnits: map[string]int64{}}
	v.item.Records = map[string]*stockdriver.Record{}
	if kvs := tr.Responses[0].GetResponseRange().Kvs; len(kvs) == 1 {
		var put, sold int64
		if _, err := fmt.Sscanf(string(kvs[0].Value), "S1|%d|%d", &put, &sold); err != nil || !strings.HasPrefix(string(kvs[0].Value), "S1|") {
			return v, fmt.Errorf("item %q: %w", kvs[0].Key, stockdriver.ErrUnknownLayout)
		}
		v.item.Exists, v.item.Put, v.item.Sold, v.itemRev = true, put, sold, kvs[0].ModRevision
	}
	for _, kv := range tr.Responses[1].GetResponseRange().Kvs {
		k := strings.TrimPrefix(string(kv.Key), dir+"h/")
		n, err := strconv.ParseInt(string(kv.Value), 10, 64)
		if err != nil {
			return v, fmt.Errorf("hold %q: %w", kv.Key, stockdriver.ErrUnknownLayout)
		}
		v.item.Held += n
		v.liveUnits[k], v.holdRev[k] = n, kv.CreateRevision
	}
	for i, k := range keys {
		kvs := tr.Responses[2+i].GetResponseRange().Kvs
		if len(kvs) == 0 {
			continue
		}
		v.recRev[k] = kvs[0].ModRevision
		r, lease, err := decodeStockRecord(k, kvs[0].Value)
		if err != nil {
			return v, err
		}
		v.leases[k] = lease
		if r.State == stockdriver.Held {
			r.Deadline = math.MaxInt64
			if v.liveUnits[k] == 0 { // its lease ended: Apply ends it
				r.Deadline = 0
				v.item.Held += r.Units
				v.gone[k] = true
			}
		}
		v.item.Records[k] = r
	}
	for k := range seen {
		if _, ok := v.recRev[k]; !ok {
			v.recRev[k] = 0
		}
	}
	v.item.Free = v.item.Put - v.item.Sold - v.item.Held
	return v, nil
}

func decodeStockRecord(key string, b []byte) (*stockdriver.Record, clientv3.LeaseID, error) {
	f := strings.Split(string(b), "|")
	if len(f) != 6 || f[0] != "S1" || (f[1] != "t" && f[1] != "h") {
		return nil, 0, fmt.Errorf("record of %q: %w", key, stockdriver.ErrUnknownLayout)
	}
	st, err1 := strconv.Atoi(f[2])
	units, err2 := strconv.ParseInt(f[3], 10, 64)
	lease, err3 := strconv.ParseInt(f[4], 10, 64)
	keep, err4 := strconv.ParseInt(f[5], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil || st < int(stockdriver.Sold) || st > int(stockdriver.Expired) {
		return nil, 0, fmt.Errorf("record of %q: %w", key, stockdriver.ErrUnknownLayout)
	}
	kind := stockdriver.Take
	if f[1] == "h" {
		kind = stockdriver.Hold
	}
	return &stockdriver.Record{Key: key, Kind: kind, State: stockdriver.State(st), Units: units, Keep: keep}, clientv3.LeaseID(lease), nil
}

// remaining fills in how long the replayed holds still last, from their
// leases (a new hold's is its TTL, as Apply said).
func (s *Store) remaining(ctx context.Context, a stockdriver.Answer, v stockView, ops []stockdriver.Op) stockdriver.Answer {
	for i, res := range a.Results {
		if res.State != stockdriver.Held || !res.Replayed {
			continue
		}
		a.Results[i].Remaining = 0
		if id := v.leases[ops[i].Key]; id != 0 {
			if ttl, err := s.c.TimeToLive(ctx, id); err == nil && ttl.TTL > 0 {
				a.Results[i].Remaining = time.Duration(ttl.TTL) * time.Second
			}
		}
	}
	a.Expired = len(v.gone)
	return a
}

var _ stockdriver.Store = (*Store)(nil)
