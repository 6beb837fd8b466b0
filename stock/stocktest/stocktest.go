package stocktest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncekit/oncekit/core/observe"
	"github.com/oncekit/oncekit/stock"
	"github.com/oncekit/oncekit/stock/stockdriver"
)

// Config describes the store under test.
type Config struct {
	// NewStore returns a store on the store under test. All stores
	// returned during one Run share their data: clients of one server, or
	// one in-process store. A driver that makes a fresh client per call
	// exercises several processes; it should close it in t.Cleanup.
	NewStore func(t *testing.T) stockdriver.Store

	// Process says the driver's TestMain calls RunWorker, so that the suite
	// can start worker processes and kill them mid-take and mid-hold.
	// In-process stores (memstore) leave it false.
	Process bool

	// ProcessEnv is added to a worker process's environment (it inherits
	// this process's): what RunWorker's constructor needs to reach the
	// store under test.
	ProcessEnv []string

	// Lag is the extra time the store may take to end a hold after its
	// TTL (its clock's resolution). Default 0.
	Lag time.Duration
}

// Run runs the whole suite.
func Run(t *testing.T, cfg Config) {
	t.Helper()
	if cfg.NewStore == nil {
		t.Fatal("stocktest: Config.NewStore is nil")
	}
	s := &suite{cfg: cfg}
	t.Run("PutAddLevel", s.putAddLevel)
	t.Run("TakeOncePerKey", s.takeOncePerKey)
	t.Run("HoldConfirmRelease", s.holdConfirmRelease)
	t.Run("HoldExpires", s.holdExpires)
	t.Run("InvalidInput", s.invalidInput)
	t.Run("NeverOversold", s.neverOversold)
	t.Run("HoldsEndOnce", s.holdsEndOnce)
	t.Run("Merged", s.merged)
	t.Run("OneBatch", s.oneBatch)
	t.Run("KilledMidTake", s.killedMidTake)
	t.Run("KilledMidHold", s.killedMidHold)
}

type suite struct{ cfg Config }

func (s *suite) stock(t *testing.T, opts ...stock.Option) *stock.Stock {
	t.Helper()
	st, err := stock.New(s.cfg.NewStore(t), opts...)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// item returns an item name unique to this test and run.
func item(t *testing.T) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "stocktest/" + strings.ReplaceAll(t.Name(), "/", ".") + "/" + hex.EncodeToString(b[:])
}

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// level reads the item's level and checks that its parts sum up.
func level(t *testing.T, st *stock.Stock, it string) stock.Level {
	t.Helper()
	l, err := st.Level(ctxTimeout(t, 10*time.Second), it)
	if err != nil {
		t.Fatalf("Level(%q): %v", it, err)
	}
	if l.Free+l.Held+l.Sold != l.Put || l.Free < 0 || l.Held < 0 || l.Sold < 0 {
		t.Fatalf("Level(%q) = %+v: free + held + sold != put", it, l)
	}
	return l
}

func wantLevel(t *testing.T, st *stock.Stock, it string, want stock.Level) {
	t.Helper()
	if got := level(t, st, it); got != want {
		t.Fatalf("Level = %+v, want %+v", got, want)
	}
}

func put(t *testing.T, st *stock.Stock, it string, units int64) {
	t.Helper()
	if _, err := st.Put(ctxTimeout(t, 10*time.Second), it, units); err != nil {
		t.Fatalf("Put(%q, %d): %v", it, units, err)
	}
}

func (s *suite) putAddLevel(t *testing.T) {
	st := s.stock(t)
	ctx := ctxTimeout(t, 20*time.Second)
	it := item(t)
	if _, err := st.Level(ctx, it); !errors.Is(err, stock.ErrUnknownItem) {
		t.Fatalf("Level of an item never put: %v, want ErrUnknownItem", err)
	}
	if _, err := st.Take(ctx, it, "k", 1); !errors.Is(err, stock.ErrUnknownItem) {
		t.Fatalf("Take of an item never put: %v, want ErrUnknownItem", err)
	}
	if l, err := st.Put(ctx, it, 10); err != nil || l != (stock.Level{Put: 10, Free: 10}) {
		t.Fatalf("Put = %+v, %v", l, err)
	}
	if l, err := st.Add(ctx, it, 5); err != nil || l != (stock.Level{Put: 15, Free: 15}) {
		t.Fatalf("Add(5) = %+v, %v", l, err)
	}
	if _, err := st.Take(ctx, it, "k1", 4); err != nil {
		t.Fatal(err)
	}
	if l, err := st.Add(ctx, it, -3); err != nil || l != (stock.Level{Put: 12, Free: 8, Sold: 4}) {
		t.Fatalf("Add(-3) = %+v, %v", l, err)
	}
	var so *stock.SoldOutError
	if _, err := st.Add(ctx, it, -9); !errors.As(err, &so) || so.Free != 8 {
		t.Fatalf("Add(-9) with 8 free: %v, want a *SoldOutError with 8 free", err)
	}
	wantLevel(t, st, it, stock.Level{Put: 12, Free: 8, Sold: 4})
	if _, err := st.Hold(ctx, it, "h1", 3, time.Minute); err != nil {
		t.Fatal(err)
	}
	// Put starts over: what it says free, none sold, the live hold kept.
	if l, err := st.Put(ctx, it, 2); err != nil || l != (stock.Level{Put: 5, Free: 2, Held: 3}) {
		t.Fatalf("Put(2) = %+v, %v", l, err)
	}
	if sale, err := st.Take(ctx, it, "k1", 4); err != nil || !sale.Replayed {
		t.Fatalf("a retry after Put = %+v, %v; want the first answer", sale, err)
	}
	if _, err := st.Confirm(ctx, it, "h1"); err != nil {
		t.Fatal(err)
	}
	if l, err := st.Put(ctx, it, 0); err != nil || l != (stock.Level{}) {
		t.Fatalf("Put(0) = %+v, %v", l, err)
	}
	// A second Stock sees the same item, put with nothing.
	wantLevel(t, s.stock(t), it, stock.Level{})
}

func (s *suite) takeOncePerKey(t *testing.T) {
	st := s.stock(t)
	ctx := ctxTimeout(t, 20*time.Second)
	it := item(t)
	put(t, st, it, 3)
	sale, err := st.Take(ctx, it, "k1", 2)
	if err != nil || sale.Units != 2 || sale.Free != 1 || sale.Replayed {
		t.Fatalf("Take = %+v, %v", sale, err)
	}
	// A retry, through another Stock: the first answer, nothing more taken.
	other := s.stock(t)
	sale, err = other.Take(ctx, it, "k1", 2)
	if err != nil || sale.Units != 2 || !sale.Replayed {
		t.Fatalf("retried Take = %+v, %v; want the first answer, replayed", sale, err)
	}
	wantLevel(t, st, it, stock.Level{Put: 3, Free: 1, Sold: 2})
	var so *stock.SoldOutError
	if _, err := st.Take(ctx, it, "k2", 2); !errors.As(err, &so) || so.Units != 2 || so.Free != 1 || so.Replayed {
		t.Fatalf("Take of 2 with 1 free: %v, want a *SoldOutError", err)
	}
	// Sold out is the key's answer too, even once units are back.
	if _, err := st.Add(ctx, it, 10); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Take(ctx, it, "k2", 2); !errors.As(err, &so) || !so.Replayed {
		t.Fatalf("retried sold-out Take: %v, want the first answer (sold out), replayed", err)
	}
	if _, err := st.Take(ctx, it, "k1", 3); !errors.Is(err, stock.ErrMismatch) {
		t.Fatalf("Take of a used key with other units: %v, want ErrMismatch", err)
	}
	if _, err := st.Hold(ctx, it, "k1", 2, time.Minute); !errors.Is(err, stock.ErrMismatch) {
		t.Fatalf("Hold with a taken key: %v, want ErrMismatch", err)
	}
	if _, err := st.Confirm(ctx, it, "k1"); !errors.Is(err, stock.ErrMismatch) {
		t.Fatalf("Confirm of a take: %v, want ErrMismatch", err)
	}
	// Keys are per item.
	it2 := item(t)
	put(t, st, it2, 1)
	if sale, err := st.Take(ctx, it2, "k1", 1); err != nil || sale.Replayed {
		t.Fatalf("Take of another item with a used key = %+v, %v", sale, err)
	}
	wantLevel(t, st, it, stock.Level{Put: 13, Free: 11, Sold: 2})
}

func (s *suite) holdConfirmRelease(t *testing.T) {
	st := s.stock(t)
	ctx := ctxTimeout(t, 20*time.Second)
	it := item(t)
	put(t, st, it, 5)
	start := time.Now()
	h, err := st.Hold(ctx, it, "h1", 2, time.Minute)
	if err != nil || h.Units != 2 || h.Free != 3 || h.Replayed {
		t.Fatalf("Hold = %+v, %v", h, err)
	}
	if d := h.Deadline.Sub(start); d < 50*time.Second || d > time.Minute+time.Second {
		t.Fatalf("Hold's deadline %v after its start, want about a minute", d)
	}
	wantLevel(t, st, it, stock.Level{Put: 5, Free: 3, Held: 2})
	if h2, err := st.Hold(ctx, it, "h1", 2, time.Minute); err != nil || !h2.Replayed || h2.Units != 2 || h2.Deadline.Sub(h.Deadline).Abs() > 5*time.Second {
		t.Fatalf("retried Hold = %+v, %v; want the first, replayed, same deadline", h2, err)
	}
	if _, err := st.Hold(ctx, it, "big", 4, time.Minute); !errors.Is(err, stock.ErrSoldOut) {
		t.Fatalf("Hold of 4 with 3 free: %v, want ErrSoldOut", err)
	}
	sale, err := st.Confirm(ctx, it, "h1")
	if err != nil || sale.Units != 2 || sale.Replayed {
		t.Fatalf("Confirm = %+v, %v", sale, err)
	}
	if sale, err := s.stock(t).Confirm(ctx, it, "h1"); err != nil || !sale.Replayed || sale.Units != 2 {
		t.Fatalf("second Confirm = %+v, %v; want the first, replayed", sale, err)
	}
	if err := st.Release(ctx, it, "h1"); !errors.Is(err, stock.ErrSold) {
		t.Fatalf("Release of a confirmed hold: %v, want ErrSold", err)
	}
	wantLevel(t, st, it, stock.Level{Put: 5, Free: 3, Sold: 2})

	if _, err := st.Hold(ctx, it, "h2", 3, time.Minute); err != nil {
		t.Fatal(err)
	}
	wantLevel(t, st, it, stock.Level{Put: 5, Held: 3, Sold: 2})
	if err := st.Release(ctx, it, "h2"); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if err := st.Release(ctx, it, "h2"); err != nil {
		t.Fatalf("second Release: %v", err)
	}
	if _, err := st.Confirm(ctx, it, "h2"); !errors.Is(err, stock.ErrHoldReleased) {
		t.Fatalf("Confirm after Release: %v, want ErrHoldReleased", err)
	}
	if _, err := st.Confirm(ctx, it, "never"); !errors.Is(err, stock.ErrNoHold) {
		t.Fatalf("Confirm of a key never held: %v, want ErrNoHold", err)
	}
	if err := st.Release(ctx, it, "never"); !errors.Is(err, stock.ErrNoHold) {
		t.Fatalf("Release of a key never held: %v, want ErrNoHold", err)
	}
	wantLevel(t, st, it, stock.Level{Put: 5, Free: 3, Sold: 2})
}

func (s *suite) holdExpires(t *testing.T) {
	st := s.stock(t)
	ctx := ctxTimeout(t, 20*time.Second)
	it := item(t)
	put(t, st, it, 4)
	const ttl = time.Second
	if _, err := st.Hold(ctx, it, "h", 3, ttl); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Hold(ctx, it, "long", 1, time.Minute); err != nil {
		t.Fatal(err)
	}
	wantLevel(t, st, it, stock.Level{Put: 4, Held: 4})
	time.Sleep(ttl + s.cfg.Lag + 100*time.Millisecond) // the hold's end is what is tested
	wantLevel(t, st, it, stock.Level{Put: 4, Free: 3, Held: 1})
	if _, err := s.stock(t).Confirm(ctx, it, "h"); !errors.Is(err, stock.ErrHoldExpired) {
		t.Fatalf("Confirm after the hold's end: %v, want ErrHoldExpired", err)
	}
	if err := st.Release(ctx, it, "h"); err != nil {
		t.Fatalf("Release after the hold's end: %v", err)
	}
	if h, err := st.Hold(ctx, it, "h", 3, ttl); !errors.Is(err, stock.ErrHoldExpired) && (err != nil || !h.Replayed) {
		t.Fatalf("retried Hold after its end: %+v, %v; want its answer", h, err)
	}
	wantLevel(t, st, it, stock.Level{Put: 4, Free: 3, Held: 1})
}

func (s *suite) invalidInput(t *testing.T) {
	st := s.stock(t)
	ctx := ctxTimeout(t, 20*time.Second)
	it := item(t)
	put(t, st, it, 5)
	long := strings.Repeat("k", 513)
	for name, err := range map[string]error{
		"empty item":      func() error { _, err := st.Take(ctx, "", "k", 1); return err }(),
		"long item":       func() error { _, err := st.Take(ctx, long, "k", 1); return err }(),
		"empty key":       func() error { _, err := st.Take(ctx, it, "", 1); return err }(),
		"long key":        func() error { _, err := st.Hold(ctx, it, long, 1, time.Minute); return err }(),
		"no units":        func() error { _, err := st.Take(ctx, it, "k", 0); return err }(),
		"negative units":  func() error { _, err := st.Hold(ctx, it, "k", -1, time.Minute); return err }(),
		"too many units":  func() error { _, err := st.Take(ctx, it, "k", stockdriver.MaxUnits+1); return err }(),
		"no ttl":          func() error { _, err := st.Hold(ctx, it, "k", 1, 0); return err }(),
		"negative put":    func() error { _, err := st.Put(ctx, it, -1); return err }(),
		"empty put item":  func() error { _, err := st.Put(ctx, "", 1); return err }(),
		"confirm no key":  func() error { _, err := st.Confirm(ctx, it, ""); return err }(),
		"release no item": st.Release(ctx, "", "k"),
	} {
		if !errors.Is(err, stock.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
	wantLevel(t, st, it, stock.Level{Put: 5, Free: 5})
}

// neverOversold: buyers in two "processes" take one unit each, every key
// sent twice at once (once by each): exactly the units put are sold, and
// both copies of a key get the same answer.
func (s *suite) neverOversold(t *testing.T) {
	a, b := s.stock(t), s.stock(t)
	ctx := ctxTimeout(t, 60*time.Second)
	it := item(t)
	const units, buyers = 50, 120
	put(t, a, it, units)
	type answer struct {
		sold bool
		err  error
	}
	answers := make([][2]answer, buyers)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range buyers {
		for j, st := range []*stock.Stock{a, b} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				_, err := st.Take(ctx, it, fmt.Sprintf("buyer-%d", i), 1)
				switch {
				case err == nil:
					answers[i][j] = answer{sold: true}
				case errors.Is(err, stock.ErrSoldOut):
				default:
					answers[i][j] = answer{err: err}
				}
			}()
		}
	}
	close(start)
	wg.Wait()
	sold := 0
	for i, ans := range answers {
		for _, x := range ans {
			if x.err != nil {
				t.Fatalf("buyer %d: %v", i, x.err)
			}
		}
		if ans[0].sold != ans[1].sold {
			t.Errorf("buyer %d got two answers: %v and %v", i, ans[0].sold, ans[1].sold)
		}
		if ans[0].sold {
			sold++
		}
	}
	if sold != units {
		t.Errorf("%d buyers were sold a unit, want %d (the units put)", sold, units)
	}
	wantLevel(t, a, it, stock.Level{Put: units, Sold: units})
}

// holdsEndOnce: holds in two "processes", half confirmed at once, half let
// run out while others read and take: every hold that ran out gave its unit
// back once, and what was sold is what was confirmed.
func (s *suite) holdsEndOnce(t *testing.T) {
	a, b := s.stock(t), s.stock(t)
	ctx := ctxTimeout(t, 60*time.Second)
	it := item(t)
	const units, holders = 40, 40
	const ttl = time.Second
	put(t, a, it, units)
	var confirmed, expired atomic.Int64
	var wg sync.WaitGroup
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() { // a reader: each read ends the holds that ran out
		defer close(stopped)
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
				l, err := b.Level(ctx, it)
				if err != nil || l.Free+l.Held+l.Sold != l.Put {
					t.Errorf("Level = %+v, %v", l, err)
					return
				}
			}
		}
	}()
	for i := range holders {
		st := []*stock.Stock{a, b}[i%2]
		wg.Add(1)
		go func() {
			defer wg.Done()
			k := fmt.Sprintf("holder-%d", i)
			if _, err := st.Hold(ctx, it, k, 1, ttl); err != nil {
				t.Errorf("Hold: %v", err)
				return
			}
			if i%2 == 0 {
				if _, err := st.Confirm(ctx, it, k); err != nil {
					t.Errorf("Confirm right after Hold: %v", err)
					return
				}
				confirmed.Add(1)
				return
			}
			time.Sleep(ttl + s.cfg.Lag + 200*time.Millisecond) // the hold's end is what is tested
			_, err := st.Confirm(ctx, it, k)
			if !errors.Is(err, stock.ErrHoldExpired) {
				t.Errorf("Confirm after the hold's end: %v, want ErrHoldExpired", err)
				return
			}
			expired.Add(1)
		}()
	}
	wg.Wait()
	close(stop)
	<-stopped
	if t.Failed() {
		return
	}
	wantLevel(t, a, it, stock.Level{Put: units, Free: units - confirmed.Load(), Sold: confirmed.Load()})
	if confirmed.Load()+expired.Load() != holders {
		t.Fatalf("%d confirmed + %d expired, want %d", confirmed.Load(), expired.Load(), holders)
	}
}

// merged: concurrent takes of one item through one Stock travel together:
// fewer store calls than takes, the merge size reported, every take
// answered on its own.
func (s *suite) merged(t *testing.T) {
	var mu sync.Mutex
	var calls, carried int
	obs := observe.Func(func(_ context.Context, ev observe.Event) {
		if ev.Op == observe.StockApply && ev.Outcome == observe.OK {
			mu.Lock()
			calls++
			carried += ev.Count
			mu.Unlock()
		}
	})
	st := s.stock(t, stock.WithObserver(obs), stock.WithMergeWait(20*time.Millisecond))
	ctx := ctxTimeout(t, 30*time.Second)
	it := item(t)
	put(t, st, it, 20)
	const takers = 32
	var wg sync.WaitGroup
	var sold, soldOut atomic.Int64
	ready := make(chan struct{})
	for i := range takers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-ready
			switch _, err := st.Take(ctx, it, fmt.Sprintf("t-%d", i), 1); {
			case err == nil:
				sold.Add(1)
			case errors.Is(err, stock.ErrSoldOut):
				soldOut.Add(1)
			default:
				t.Errorf("Take: %v", err)
			}
		}()
	}
	close(ready)
	wg.Wait()
	if sold.Load() != 20 || soldOut.Load() != takers-20 {
		t.Fatalf("%d sold, %d sold out; want 20 and %d", sold.Load(), soldOut.Load(), takers-20)
	}
	mu.Lock()
	defer mu.Unlock()
	if carried != takers || calls >= takers {
		t.Fatalf("%d store calls carried %d operations; want fewer calls than the %d takes, carrying them all", calls, carried, takers)
	}
	t.Logf("%d takes in %d store calls", takers, calls)
}

// oneBatch gives the driver one batch of takes and holds — what a merged
// call carries — that mixes every answer: a replay, a new take, a new
// hold, a record of another kind (mismatch), a hold that ran out before
// the call, sold out, and keys the same call took before; each op must
// see the ones before it.
func (s *suite) oneBatch(t *testing.T) {
	store := s.cfg.NewStore(t)
	ctx := ctxTimeout(t, 30*time.Second)
	it := item(t)
	keep := time.Hour
	apply := func(ops ...stockdriver.Op) stockdriver.Answer {
		t.Helper()
		a, err := store.ApplyStock(ctx, it, ops)
		if err != nil {
			t.Fatal(err)
		}
		if len(a.Results) != len(ops) {
			t.Fatalf("%d results for %d ops", len(a.Results), len(ops))
		}
		return a
	}
	take := func(key string, units int64) stockdriver.Op {
		return stockdriver.Op{Kind: stockdriver.Take, Key: key, Units: units, Keep: keep}
	}
	hold := func(key string, units int64, ttl time.Duration) stockdriver.Op {
		return stockdriver.Op{Kind: stockdriver.Hold, Key: key, Units: units, TTL: ttl, Keep: keep}
	}
	apply(stockdriver.Op{Kind: stockdriver.Set, Units: 4})
	apply(take("a", 1), hold("gone", 1, 50*time.Millisecond))
	time.Sleep(300*time.Millisecond + s.cfg.Lag)
	// free 2, held 1 (ran out: free 3 once ended), sold 1
	a := apply(take("a", 1), take("b", 1), hold("c", 1, time.Hour), take("gone", 1), take("d", 5), take("e", 1), take("f", 1),
		take("b", 1), take("d", 5))
	want := []stockdriver.Result{
		{State: stockdriver.Sold, Units: 1, Replayed: true},
		{State: stockdriver.Sold, Units: 1},
		{State: stockdriver.Held, Units: 1},
		{State: stockdriver.Mismatch, Units: 1},
		{State: stockdriver.SoldOut, Units: 5},
		{State: stockdriver.Sold, Units: 1},
		{State: stockdriver.SoldOut, Units: 1},
		{State: stockdriver.Sold, Units: 1, Replayed: true},    // b again, in the same call
		{State: stockdriver.SoldOut, Units: 5, Replayed: true}, // d again
	}
	for i, w := range want {
		got := a.Results[i]
		rem := got.Remaining
		got.Remaining = 0
		if got != w {
			t.Errorf("op %d: %+v, want %+v", i, a.Results[i], w)
		}
		if w.State == stockdriver.Held && (rem <= 0 || rem > time.Hour) {
			t.Errorf("op %d: a new hour's hold has %v remaining", i, rem)
		}
	}
	if wantLvl := (stockdriver.Level{Put: 4, Free: 0, Held: 1, Sold: 3}); !a.Exists || a.Level != wantLvl {
		t.Errorf("level %+v (exists %v), want %+v", a.Level, a.Exists, wantLvl)
	}
	// The batch's records are kept: each key answers again as it did.
	b := apply(take("b", 1), take("d", 5), hold("c", 1, time.Hour), take("f", 1), take("new", 1))
	for i, w := range []stockdriver.State{stockdriver.Sold, stockdriver.SoldOut, stockdriver.Held, stockdriver.SoldOut, stockdriver.SoldOut} {
		if b.Results[i].State != w || (i < 4 && !b.Results[i].Replayed) {
			t.Errorf("again, op %d: %+v, want %v replayed", i, b.Results[i], w)
		}
	}
}
