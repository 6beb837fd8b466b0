package zkstore_test

import (
	"context"
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/oncekit/oncekit/stock"
	"github.com/oncekit/oncekit/stock/stockdriver"
	"github.com/oncekit/oncekit/stock/stocktest"
	"github.com/oncekit/oncekit/storage/zkstore"
)

func TestStock(t *testing.T) {
	t.Parallel()
	stocktest.Run(t, stocktest.Config{
		NewStore: func(t *testing.T) stockdriver.Store { return connect(t) },
		Process:  true,
	})
}

// Cleanup forgets the stock records whose memory has passed, never a
// live hold.
func TestStockCleanup(t *testing.T) {
	t.Parallel()
	s := connect(t)
	st, err := stock.New(s, stock.WithMemory(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	item := "cleanup-" + time.Now().Format(time.RFC3339Nano)
	if _, err := st.Put(ctx, item, 5); err != nil {
		t.Fatal(err)
	}
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
	if sale, err := st.Take(ctx, item, "t", 1); err != nil || sale.Replayed {
		t.Fatalf("Take of a forgotten key = %+v, %v; want a new take", sale, err)
	}
	if err := st.Release(ctx, item, "h"); err != nil {
		t.Fatalf("Release of the hold the cleanup kept: %v", err)
	}
	if l, err := st.Level(ctx, item); err != nil || l != (stock.Level{Put: 5, Free: 3, Sold: 2}) {
		t.Fatalf("Level = %+v, %v", l, err)
	}
}

// The stock znodes v0.1.0 wrote (testdata/stock/v0.1.0.json) are
// read as they were meant by this version.
func TestStockLayouts(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("testdata/stock/v0.1.0.json")
	if err != nil {
		t.Fatal(err)
	}
	var g struct {
		Item    string
		Records map[string]string
	}
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	s := connect(t)
	stocktest.CheckLayout(t, s, func(t *testing.T, item string) {
		// A first Put makes the item's node (and its parents); the golden
		// data is then written over it.
		st, err := stock.New(s)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Put(context.Background(), item, 0); err != nil {
			t.Fatal(err)
		}
		now := time.Now() // (the ensemble runs on this machine)
		times := strings.NewReplacer("{deadline}", strconv.FormatInt(now.Add(time.Hour).UnixMilli(), 10),
			"{day}", strconv.FormatInt(now.Add(24*time.Hour).UnixMilli(), 10))
		path := zkstore.StockItemPath(s, item)
		if _, err := s.Conn().Set(path, []byte(times.Replace(g.Item)), -1); err != nil {
			t.Fatal(err)
		}
		for k, v := range g.Records {
			if _, err := s.Conn().Create(path+"/"+zkstore.Escape(k), []byte(times.Replace(v)), 0, zk.WorldACL(zk.PermAll)); err != nil {
				t.Fatal(err)
			}
		}
	})
}
