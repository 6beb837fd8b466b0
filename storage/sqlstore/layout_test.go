package sqlstore_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/storage"
	"github.com/oncekit/oncekit/storage/internal/layouts"
	"github.com/oncekit/oncekit/storage/sqlstore"
)

// sqlRecord is a records row as a released version wrote it; its expiry
// is kept relative to the moment it was read (the server's clock).
type sqlRecord struct {
	State       int    `json:"state"`
	Fingerprint []byte `json:"fingerprint"`
	Token       string `json:"token"`
	Fence       int64  `json:"fence"`
	ExpiresInMs int64  `json:"expires_in_ms"`
	Result      []byte `json:"result"`
	Attempt     int    `json:"attempt"`
}

// sqlLock is a locks row, likewise.
type sqlLock struct {
	Token       string `json:"token"`
	Owner       []byte `json:"owner"`
	Holds       int    `json:"holds"`
	Fence       int64  `json:"fence"`
	ExpiresInMs int64  `json:"expires_in_ms"`
}

// The rows that released versions wrote (testdata/layouts, one file per
// version, the same on both dialects) are judged by this version as they
// were meant: a claim in flight is not taken over, a completed record
// replays, an abandoned one is the next attempt. A change of layout that
// would break a rolling deploy fails here.
func TestStoredLayouts(t *testing.T) {
	for name, url := range databases(t) {
		t.Run(name, func(t *testing.T) {
			s := migrated(t, url)
			if layouts.Writing() && name == "postgres" {
				writeSQLLayouts(t, s)
			}
			locks, _, records := s.Tables()
			layouts.Check(t, "testdata/layouts", s, func(t *testing.T, key string, l layouts.Layout) {
				now := time.Now().UnixMicro()
				if l.What == "lock" {
					var d sqlLock
					if err := json.Unmarshal(l.Data, &d); err != nil {
						t.Fatal(err)
					}
					execSQL(t, s, "INSERT INTO "+locks+" (lock_key, token, owner, holds, fence, expires_us) VALUES (?, ?, ?, ?, ?, ?)",
						[]byte(key), d.Token, d.Owner, d.Holds, d.Fence, now+d.ExpiresInMs*1000)
					return
				}
				var d sqlRecord
				if err := json.Unmarshal(l.Data, &d); err != nil {
					t.Fatal(err)
				}
				execSQL(t, s, "INSERT INTO "+records+" (record_key, state, fingerprint, token, fence, expires_us, result, attempt) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
					[]byte(key), d.State, d.Fingerprint, d.Token, d.Fence, now+d.ExpiresInMs*1000, d.Result, d.Attempt)
			})
		})
	}
}

func writeSQLLayouts(t *testing.T, s *sqlstore.Store) {
	ctx := t.Context()
	run := fmt.Sprint(time.Now().UnixNano())
	locks, _, records := s.Tables()
	var out []layouts.Layout
	read := func(l layouts.Layout, key string) layouts.Layout {
		var d sqlRecord
		var exp int64
		if err := s.DB().QueryRowContext(ctx, rebind(s, "SELECT state, fingerprint, token, fence, expires_us, result, attempt FROM "+records+" WHERE record_key = ?"), []byte(key)).
			Scan(&d.State, &d.Fingerprint, &d.Token, &d.Fence, &exp, &d.Result, &d.Attempt); err != nil {
			t.Fatal(err)
		}
		d.ExpiresInMs = (exp - time.Now().UnixMicro()) / 1000
		l.Data, _ = json.Marshal(d)
		return l
	}
	begin := func(key, fp string) idemdriver.Claim {
		c, err := s.Begin(ctx, idemdriver.MustKey(key), fp, 30*time.Second)
		if err != nil || c.State != idemdriver.Acquired {
			t.Fatalf("begin %s: %v %v", key, c.State, err)
		}
		return c
	}
	k := "golden-inflight-" + run
	c := begin(k, "fp-1")
	out = append(out, read(layouts.Layout{Name: "record in flight", What: "record", Want: "in_flight", Fingerprint: "fp-1"}, k))
	l := read(layouts.Layout{Name: "record in flight, lease ended", What: "record", Want: "free", Fingerprint: "fp-1", Fence: c.Fence, Attempt: 2}, k)
	var d sqlRecord
	_ = json.Unmarshal(l.Data, &d)
	d.ExpiresInMs = -1000
	l.Data, _ = json.Marshal(d)
	out = append(out, l)
	_ = s.Abandon(ctx, c)

	k = "golden-completed-" + run
	c = begin(k, "fp-2")
	if err := s.Complete(ctx, c, []byte(`{"order":"o-1"}`), time.Hour); err != nil {
		t.Fatal(err)
	}
	out = append(out, read(layouts.Layout{Name: "record completed", What: "record", Want: "completed", Fingerprint: "fp-2", Result: []byte(`{"order":"o-1"}`)}, k))

	k = "golden-abandoned-" + run
	c = begin(k, "fp-3")
	if err := s.Abandon(ctx, c); err != nil {
		t.Fatal(err)
	}
	out = append(out, read(layouts.Layout{Name: "record abandoned", What: "record", Want: "free", Fingerprint: "fp-3", Fence: c.Fence, Attempt: 2}, k))

	// A row of a later layout (a state this one does not have): never
	// taken over, whatever its expiry says.
	var later sqlRecord
	_ = json.Unmarshal(out[0].Data, &later)
	later.State = 3
	data, _ := json.Marshal(later)
	out = append(out, layouts.Layout{Name: "record of a later layout", What: "record", Want: "unknown_layout", Fingerprint: "fp-1", Data: data})

	k = "golden-lock-" + run
	lease, err := s.Acquire(ctx, k, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	readLock := func(l layouts.Layout) layouts.Layout {
		var d sqlLock
		var exp int64
		if err := s.DB().QueryRowContext(ctx, rebind(s, "SELECT token, owner, holds, fence, expires_us FROM "+locks+" WHERE lock_key = ?"), []byte(k)).
			Scan(&d.Token, &d.Owner, &d.Holds, &d.Fence, &exp); err != nil {
			t.Fatal(err)
		}
		d.ExpiresInMs = (exp - time.Now().UnixMicro()) / 1000
		l.Fence = uint64(d.Fence)
		l.Data, _ = json.Marshal(d)
		return l
	}
	out = append(out, readLock(layouts.Layout{Name: "lock held", What: "lock", Want: "held"}))
	if err := lease.Release(context.WithoutCancel(ctx)); err != nil {
		t.Fatal(err)
	}
	out = append(out, readLock(layouts.Layout{Name: "lock released", What: "lock", Want: "lock_free"}))
	layouts.Write(t, "testdata/layouts/v0.1.0.json", out)
}

// Tables name their layout in their comments: Migrate names it (also on
// tables made before it was named), and a Store refuses tables that a
// later version migrated to a layout it does not read — Migrate, and
// storage.Open with or without migrate=false — with idem.ErrUnknownLayout.
func TestTablesOfALaterLayoutAreRefused(t *testing.T) {
	for name, url := range databases(t) {
		t.Run(name, func(t *testing.T) {
			prefix := fmt.Sprintf("lay%d_", time.Now().UnixNano()%1_000_000_000)
			s := migrated(t, url, sqlstore.WithTablePrefix(prefix))
			_, _, records := s.Tables()
			t.Cleanup(func() {
				l, w, r := s.Tables()
				for _, table := range []string{l, w, r} {
					_, _ = s.DB().ExecContext(context.Background(), "DROP TABLE IF EXISTS "+table)
				}
			})
			if err := s.CheckLayout(t.Context()); err != nil {
				t.Fatalf("CheckLayout of tables Migrate made: %v", err)
			}
			comment := "COMMENT ON TABLE " + records + " IS 'oncekit layout 2'"
			if s.Dialect() != sqlstore.Postgres {
				comment = "ALTER TABLE " + records + " COMMENT = 'oncekit layout 2'"
			}
			execSQL(t, s, comment)
			if err := s.CheckLayout(t.Context()); !errors.Is(err, idem.ErrUnknownLayout) {
				t.Errorf("CheckLayout of a later layout = %v, want idem.ErrUnknownLayout", err)
			}
			if err := s.Migrate(t.Context()); !errors.Is(err, idem.ErrUnknownLayout) {
				t.Errorf("Migrate of a later layout = %v, want idem.ErrUnknownLayout", err)
			}
			for _, param := range []string{"", "migrate=false"} {
				u := withParam(url, "prefix="+prefix)
				if param != "" {
					u = withParam(u, param)
				}
				if st, err := storage.Open(t.Context(), u); !errors.Is(err, idem.ErrUnknownLayout) {
					if err == nil {
						st.Close()
					}
					t.Errorf("storage.Open(%s) of a later layout = %v, want idem.ErrUnknownLayout", param, err)
				}
			}
		})
	}
}
