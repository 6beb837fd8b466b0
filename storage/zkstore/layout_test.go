package zkstore_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/storage/internal/layouts"
	"github.com/oncekit/oncekit/storage/zkstore"
)

// zkLayout is a ZooKeeper layout's stored data: a record znode's bytes, or
// a lock's acquisition node (its data, made ephemeral by another session).
type zkLayout struct {
	Data []byte `json:"data"`
}

// create makes p with data, and its parents.
func create(t *testing.T, c *zk.Conn, p string, data []byte, flags int32) string {
	t.Helper()
	parts := strings.Split(strings.TrimPrefix(path.Dir(p), "/"), "/")
	for i := range parts {
		dir := "/" + strings.Join(parts[:i+1], "/")
		if _, err := c.Create(dir, nil, 0, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			t.Fatal(err)
		}
	}
	made, err := c.Create(p, data, flags, zk.WorldACL(zk.PermAll))
	if err != nil {
		t.Fatal(err)
	}
	return made
}

// The records and locks that released versions wrote (testdata/layouts,
// one file per version) are judged by this version as they were meant; a
// record of a format this version does not read is left alone. A change
// of layout that would break a rolling deploy fails here.
func TestStoredLayouts(t *testing.T) {
	t.Parallel()
	store, other := connect(t), connect(t) // other: a holder's session
	if layouts.Writing() {
		writeLayouts(t, store)
	}
	layouts.Check(t, "testdata/layouts", store, func(t *testing.T, key string, l layouts.Layout) {
		var d zkLayout
		if err := json.Unmarshal(l.Data, &d); err != nil {
			t.Fatal(err)
		}
		if l.What == "lock" {
			create(t, other.Conn(), zkstore.LockDir(store, key)+"/held-", d.Data, zk.FlagEphemeral|zk.FlagSequence)
			return
		}
		create(t, store.Conn(), zkstore.RecordPath(store, key), d.Data, 0)
	})
}

func writeLayouts(t *testing.T, store *zkstore.Store) {
	ctx := t.Context()
	run := fmt.Sprint(time.Now().UnixNano())
	var out []layouts.Layout
	read := func(l layouts.Layout, p string) layouts.Layout {
		data, _, err := store.Conn().Get(p)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		l.Data, _ = json.Marshal(zkLayout{Data: data})
		return l
	}
	begin := func(key, fp string) idemdriver.Claim {
		c, err := store.Begin(ctx, idemdriver.MustKey(key), fp, 30*time.Second)
		if err != nil || c.State != idemdriver.Acquired {
			t.Fatalf("begin %s: %v %v", key, c.State, err)
		}
		return c
	}
	k := "golden-inflight-" + run
	c := begin(k, "fp-1")
	out = append(out, read(layouts.Layout{Name: "record in flight", What: "record", Want: "in_flight", Fingerprint: "fp-1"}, zkstore.RecordPath(store, k)))
	_ = store.Abandon(ctx, c)

	k = "golden-completed-" + run
	c = begin(k, "fp-2")
	if err := store.Complete(ctx, c, []byte(`{"order":"o-1"}`), time.Hour); err != nil {
		t.Fatal(err)
	}
	out = append(out, read(layouts.Layout{Name: "record completed", What: "record", Want: "completed", Fingerprint: "fp-2", Result: []byte(`{"order":"o-1"}`)}, zkstore.RecordPath(store, k)))

	k = "golden-abandoned-" + run
	c = begin(k, "fp-3")
	if err := store.Abandon(ctx, c); err != nil {
		t.Fatal(err)
	}
	out = append(out, read(layouts.Layout{Name: "record abandoned", What: "record", Want: "free", Fingerprint: "fp-3", Attempt: 2}, zkstore.RecordPath(store, k)))
	c = begin(k, "fp-3")
	out = append(out, read(layouts.Layout{Name: "record in flight, attempt 2", What: "record", Want: "in_flight", Fingerprint: "fp-3"}, zkstore.RecordPath(store, k)))
	_ = store.Abandon(ctx, c)

	// A record of a later format: never judged, never taken over.
	var first zkLayout
	_ = json.Unmarshal(out[0].Data, &first)
	later := append([]byte{3}, first.Data[1:]...)
	d, _ := json.Marshal(zkLayout{Data: later})
	out = append(out, layouts.Layout{Name: "record of format 3", What: "record", Want: "unknown_layout", Fingerprint: "fp-1", Data: d})

	k = "golden-lock-" + run
	lease, err := store.Acquire(ctx, k, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	kids, _, err := store.Conn().Children(zkstore.LockDir(store, k))
	if err != nil || len(kids) != 1 {
		t.Fatalf("lock nodes %v, %v", kids, err)
	}
	out = append(out, read(layouts.Layout{Name: "lock held", What: "lock", Want: "held"}, zkstore.LockDir(store, k)+"/"+kids[0]))
	_ = lease.Release(ctx)
	layouts.Write(t, "testdata/layouts/v0.1.0.json", out)
}
