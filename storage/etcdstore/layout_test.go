package etcdstore_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/storage/etcdstore"
	"github.com/oncekit/oncekit/storage/internal/layouts"
)

// etcdLayout is an etcd layout's stored entry: its name under the key's
// record directory or lock prefix, and its value.
type etcdLayout struct {
	Entry string `json:"entry"`
	Value []byte `json:"value"`
}

// The records and locks that released versions wrote (testdata/layouts,
// one file per version) are judged by this version as they were meant; a
// record of a layout this version does not read is left alone. A change
// of layout that would break a rolling deploy fails here.
func TestStoredLayouts(t *testing.T) {
	t.Parallel()
	c := newClient(t, testenv.EtcdAddrs(t))
	store := newStore(t, c, etcdstore.WithPrefix("layout/lock/"), etcdstore.WithRecordPrefix("layout/idem/"))
	if layouts.Writing() {
		writeEtcdLayouts(t, store, c)
	}
	layouts.Check(t, "testdata/layouts", store, func(t *testing.T, key string, l layouts.Layout) {
		var d etcdLayout
		if err := json.Unmarshal(l.Data, &d); err != nil {
			t.Fatal(err)
		}
		name := etcdstore.RecordDir(store, key) + d.Entry
		if l.What == "lock" {
			name = etcdstore.LockPrefix(store, key) + d.Entry
		}
		if _, err := c.Put(t.Context(), name, string(d.Value)); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Delete(context.Background(), name) })
	})
}

func writeEtcdLayouts(t *testing.T, store *etcdstore.Store, c *clientv3.Client) {
	ctx := t.Context()
	run := fmt.Sprint(time.Now().UnixNano())
	var out []layouts.Layout
	read := func(l layouts.Layout, prefix string) layouts.Layout {
		resp, err := c.Get(ctx, prefix, clientv3.WithPrefix())
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("%s: %v entries, %v", prefix, len(resp.Kvs), err)
		}
		l.Data, _ = json.Marshal(etcdLayout{Entry: string(resp.Kvs[0].Key[len(prefix):]), Value: resp.Kvs[0].Value})
		return l
	}
	begin := func(key, fp string) idemdriver.Claim {
		cl, err := store.Begin(ctx, idemdriver.MustKey(key), fp, 30*time.Second)
		if err != nil || cl.State != idemdriver.Acquired {
			t.Fatalf("begin %s: %v %v", key, cl.State, err)
		}
		return cl
	}
	k := "golden-inflight-" + run
	cl := begin(k, "fp-1")
	out = append(out, read(layouts.Layout{Name: "record in flight", What: "record", Want: "in_flight", Fingerprint: "fp-1"}, etcdstore.RecordDir(store, k)))
	_ = store.Abandon(ctx, cl)

	k = "golden-completed-" + run
	cl = begin(k, "fp-2")
	if err := store.Complete(ctx, cl, []byte(`{"order":"o-1"}`), time.Hour); err != nil {
		t.Fatal(err)
	}
	// A completed record keeps its retention's end; the golden one is
	// kept far ahead, so that it is still retained whenever it is read.
	l := read(layouts.Layout{Name: "record completed", What: "record", Want: "completed", Fingerprint: "fp-2", Result: []byte(`{"order":"o-1"}`)}, etcdstore.RecordDir(store, k))
	var d etcdLayout
	_ = json.Unmarshal(l.Data, &d)
	far := []byte(d.Value)
	exp := uint64(time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli())
	for i := range 8 {
		far[2+i] = byte(exp >> (56 - 8*i))
	}
	l.Data, _ = json.Marshal(etcdLayout{Entry: d.Entry, Value: far})
	out = append(out, l)

	var first etcdLayout
	_ = json.Unmarshal(out[0].Data, &first)
	later := append([]byte{2}, first.Value[1:]...)
	data, _ := json.Marshal(etcdLayout{Entry: first.Entry, Value: later})
	out = append(out, layouts.Layout{Name: "record of layout 2", What: "record", Want: "unknown_layout", Fingerprint: "fp-1", Data: data})

	k = "golden-lock-" + run
	lease, err := store.Acquire(ctx, k, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	out = append(out, read(layouts.Layout{Name: "lock held", What: "lock", Want: "held"}, etcdstore.LockPrefix(store, k)))
	_ = lease.Release(ctx)
	layouts.Write(t, "testdata/layouts/v0.1.0.json", out)
}
