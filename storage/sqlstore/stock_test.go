package sqlstore_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/oncekit/oncekit/stock"
	"github.com/oncekit/oncekit/stock/stockdriver"
	"github.com/oncekit/oncekit/stock/stocktest"
)

func TestStock(t *testing.T) {
	t.Parallel()
	for name, url := range suiteDatabases(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			migrated(t, url)
			stocktest.Run(t, stocktest.Config{
				NewStore:   func(t *testing.T) stockdriver.Store { return suiteStore(t, name, url) },
				Process:    true,
				ProcessEnv: []string{holderURLEnv + "=" + url},
			})
		})
	}
}

// A record of a state this layout does not have fails the call and
// changes nothing; the cleanup forgets records whose memory has passed,
// never a live hold.
func TestStockLayoutAndCleanup(t *testing.T) {
	t.Parallel()
	for name, url := range databases(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := migrated(t, url)
			st, err := stock.New(s, stock.WithMemory(time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			item := t.Name() + time.Now().Format(time.RFC3339Nano)
			if _, err := st.Put(ctx, item, 5); err != nil {
				t.Fatal(err)
			}
			_, records := s.StockTables()
			execSQL(t, s, "INSERT INTO "+records+" (item, take_key, kind, state, units, deadline_ms, until_ms, keep_ms) VALUES (?, ?, 1, 9, 1, 0, ?, 0)",
				[]byte(item), []byte("later"), time.Now().Add(time.Hour).UnixMilli())
			if _, err := st.Take(ctx, item, "later", 1); !errors.Is(err, stock.ErrUnknownLayout) {
				t.Fatalf("Take of a key whose record is of a later layout: %v, want ErrUnknownLayout", err)
			}
			execSQL(t, s, "DELETE FROM "+records+" WHERE item = ?", []byte(item))
			if _, err := st.Take(ctx, item, "t", 1); err != nil {
				t.Fatal(err)
			}
			if _, err := st.Hold(ctx, item, "h", 1, time.Hour); err != nil {
				t.Fatal(err)
			}
			time.Sleep(20 * time.Millisecond) // the take's memory (1 ms) is what ends
			if _, err := s.Cleanup(ctx); err != nil {
				t.Fatal(err)
			}
			var n int
			if err := s.DB().QueryRowContext(ctx, rebind(s, "SELECT COUNT(*) FROM "+records+" WHERE item = ?"), []byte(item)).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n != 1 {
				t.Fatalf("%d records left after the cleanup, want 1 (the live hold)", n)
			}
			if err := st.Release(ctx, item, "h"); err != nil {
				t.Fatalf("Release of the hold the cleanup kept: %v", err)
			}
			if l, err := st.Level(ctx, item); err != nil || l != (stock.Level{Put: 5, Free: 4, Sold: 1}) {
				t.Fatalf("Level = %+v, %v", l, err)
			}
		})
	}
}

// The stock rows v0.1.0 wrote (testdata/stock/v0.1.0.json) are
// read as they were meant by this version.
func TestStockLayouts(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("testdata/stock/v0.1.0.json")
	if err != nil {
		t.Fatal(err)
	}
	var g struct {
		Item    struct{ Put, Free, Held, Sold int64 }
		Records []struct {
			Key             string
			Kind, State     int
			Units           int64
			Deadline, Until string `json:"-"`
			DeadlineMs      string `json:"deadline_ms"`
			UntilMs         string `json:"until_ms"`
			KeepMs          int64  `json:"keep_ms"`
		}
	}
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	for name, url := range databases(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := migrated(t, url)
			items, records := s.StockTables()
			stocktest.CheckLayout(t, s, func(t *testing.T, item string) {
				now := time.Now() // (the test servers run on this machine)
				times := strings.NewReplacer("{deadline}", strconv.FormatInt(now.Add(time.Hour).UnixMilli(), 10),
					"{day}", strconv.FormatInt(now.Add(24*time.Hour).UnixMilli(), 10))
				execSQL(t, s, "INSERT INTO "+items+" (item, put, free, held, sold) VALUES (?, ?, ?, ?, ?)",
					[]byte(item), g.Item.Put, g.Item.Free, g.Item.Held, g.Item.Sold)
				for _, r := range g.Records {
					deadline, _ := strconv.ParseInt(times.Replace(r.DeadlineMs), 10, 64)
					until, _ := strconv.ParseInt(times.Replace(r.UntilMs), 10, 64)
					execSQL(t, s, "INSERT INTO "+records+" (item, take_key, kind, state, units, deadline_ms, until_ms, keep_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
						[]byte(item), []byte(r.Key), r.Kind, r.State, r.Units, deadline, until, r.KeepMs)
				}
			})
		})
	}
}
