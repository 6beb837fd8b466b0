package layouttest

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/storage/internal/layouts"
	"github.com/oncekit/oncekit/storage/internal/rediskit"
)

// Data is a Redis layout's stored value and its expiry.
type Data struct {
	Value  string `json:"value"`
	PTTLms int64  `json:"pttl_ms"`
}

// Names are the Store's key prefixes (WithPrefix, WithRecordPrefix).
type Names struct {
	Keys    rediskit.Keys
	Records rediskit.Records
}

func (n Names) name(l layouts.Layout, key string) string {
	if l.What == "lock" {
		return n.Keys.Lock(key)
	}
	return n.Records.Record(idemdriver.MustKey(key))
}

// Plant returns CheckLayouts' plant for a store over nodes (one client,
// or a Redlock's every node).
func Plant(nodes []*redis.Client, names Names) func(t *testing.T, key string, l layouts.Layout) {
	return func(t *testing.T, key string, l layouts.Layout) {
		var d Data
		if err := json.Unmarshal(l.Data, &d); err != nil {
			t.Fatalf("layout %s: %v", l.Name, err)
		}
		name := names.name(l, key)
		for _, c := range nodes {
			if err := c.Set(t.Context(), name, d.Value, time.Duration(d.PTTLms)*time.Millisecond).Err(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Del(context.Background(), name) })
		}
	}
}

// Store is what Write drives: every Redis driver's Store.
type Store interface {
	layouts.Store
}

// Write makes the golden layouts of this version by driving store (over
// node, one of its servers, where the values are read) and writes them to
// file.
func Write(t *testing.T, file string, store Store, node *redis.Client, names Names) {
	ctx := t.Context()
	var out []layouts.Layout
	read := func(l layouts.Layout, key string, pttl int64) layouts.Layout {
		name := names.name(l, key)
		v, err := node.Get(ctx, name).Result()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if pttl == 0 {
			pttl = node.PTTL(ctx, name).Val().Milliseconds()
		}
		l.Data, _ = json.Marshal(Data{Value: v, PTTLms: pttl})
		return l
	}
	begin := func(key, fp string) idemdriver.Claim {
		c, err := store.Begin(ctx, idemdriver.MustKey(key), fp, 30*time.Second)
		if err != nil || c.State != idemdriver.Acquired {
			t.Fatalf("begin %s: %v %v", key, c.State, err)
		}
		return c
	}
	run := fmt.Sprint(time.Now().UnixNano())
	key := func(what string) string { return "golden-" + what + "-" + run }

	c := begin(key("inflight"), "fp-1")
	out = append(out, read(layouts.Layout{Name: "record in flight", What: "record", Want: "in_flight", Fingerprint: "fp-1"}, key("inflight"), 0))
	// The same claim once its lease ran out: the record stays, as the
	// memory of an attempt, for idem.AttemptMemory past the lease.
	out = append(out, read(layouts.Layout{Name: "record in flight, lease ended", What: "record", Want: "free", Fingerprint: "fp-1", Fence: c.Fence, Attempt: 2},
		key("inflight"), idem.AttemptMemory.Milliseconds()-1000))
	_ = store.Abandon(ctx, c)

	c = begin(key("completed"), "fp-2")
	if err := store.Complete(ctx, c, []byte(`{"order":"o-1"}`), time.Hour); err != nil {
		t.Fatal(err)
	}
	out = append(out, read(layouts.Layout{Name: "record completed", What: "record", Want: "completed", Fingerprint: "fp-2", Result: []byte(`{"order":"o-1"}`)}, key("completed"), 0))

	c = begin(key("abandoned"), "fp-3")
	if err := store.Abandon(ctx, c); err != nil {
		t.Fatal(err)
	}
	out = append(out, read(layouts.Layout{Name: "record abandoned", What: "record", Want: "free", Fingerprint: "fp-3", Fence: c.Fence, Attempt: 2}, key("abandoned"), 0))

	c2 := begin(key("abandoned"), "fp-3") // attempt 2, in flight
	out = append(out, read(layouts.Layout{Name: "record in flight, attempt 2", What: "record", Want: "in_flight", Fingerprint: "fp-3"}, key("abandoned"), 0))
	out = append(out, read(layouts.Layout{Name: "record in flight, attempt 2, lease ended", What: "record", Want: "free", Fingerprint: "fp-3", Fence: c2.Fence, Attempt: 3},
		key("abandoned"), idem.AttemptMemory.Milliseconds()-1000))
	_ = store.Abandon(ctx, c2)

	// A record of the layout before R2 (its in-flight PTTL was the lease
	// alone): this version cannot judge its lease, and never takes it
	// over.
	var first Data
	_ = json.Unmarshal(out[0].Data, &first)
	old := strings.Replace(first.Value, rediskit.RecordLayout+"|", "R1|", 1)
	d, _ := json.Marshal(Data{Value: old, PTTLms: 30_000})
	out = append(out, layouts.Layout{Name: "record of layout R1", What: "record", Want: "unknown_layout", Fingerprint: "fp-1", Data: d})

	lease, err := store.Acquire(ctx, key("lock"), 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	out = append(out, read(layouts.Layout{Name: "lock held", What: "lock", Want: "held"}, key("lock"), 0))
	_ = lease.Release(ctx)
	// A released lock whose fence ran ahead of the server's clock keeps
	// it in a tombstone.
	d, _ = json.Marshal(Data{Value: fmt.Sprintf("L1|~|%d|", lease.Fence()+1000), PTTLms: 60_000})
	out = append(out, layouts.Layout{Name: "lock tombstone", What: "lock", Want: "lock_free", Fence: lease.Fence() + 1000, Data: d})
	// A lock value of another layout (here the unversioned one before L1,
	// a tombstone there): held by someone this version does not know until
	// its PTTL runs out, never taken over.
	d, _ = json.Marshal(Data{Value: fmt.Sprintf("~|%d|", lease.Fence()+1000), PTTLms: 60_000})
	out = append(out, layouts.Layout{Name: "lock of another layout", What: "lock", Want: "held", Data: d})
	layouts.Write(t, file, out)
}
