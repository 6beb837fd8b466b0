package stock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/lock/lockdriver"
	"github.com/oncekit/oncekit/core/observe"
	"github.com/oncekit/oncekit/stock/stockdriver"
)

// Stock keeps items' units in a store and takes and holds them once per
// key. It is safe for concurrent use; make one per store and share it, so
// that concurrent operations on an item merge.
type Stock struct {
	store     stockdriver.Store
	driver    string
	memory    time.Duration
	maxMerge  int
	mergeWait time.Duration
	timeout   time.Duration
	observer  observe.Observer
	observed  bool // WithObserver was given
	merge     merger
}

// Refuser is implemented by a store that cannot keep stock, to say why
// (New returns its error).
type Refuser interface {
	StockRefusal() error
}

// New returns a Stock over store: a driver that keeps stock (memstore,
// redisstore, sqlstore, etcdstore, zkstore implement
// stockdriver.Store). A store that cannot keep it is refused with the
// reason (redlockstore: a quorum of independent servers cannot keep one
// sum).
func New(store any, opts ...Option) (*Stock, error) {
	if r, ok := store.(Refuser); ok {
		if err := r.StockRefusal(); err != nil {
			return nil, err
		}
	}
	st, ok := store.(stockdriver.Store)
	if !ok {
		return nil, fmt.Errorf("stock: %T keeps no stock (it is no stockdriver.Store)", store)
	}
	s := &Stock{store: st, driver: observe.DriverOf(store), memory: DefaultMemory, maxMerge: DefaultMaxMerge, timeout: DefaultTimeout}
	for _, o := range opts {
		o(s)
	}
	switch {
	case s.memory < time.Millisecond:
		return nil, fmt.Errorf("%w: memory %v: at least 1ms", ErrInvalid, s.memory)
	case s.maxMerge < 1:
		return nil, fmt.Errorf("%w: max merge %d: at least 1", ErrInvalid, s.maxMerge)
	case s.mergeWait < 0 || s.timeout <= 0:
		return nil, fmt.Errorf("%w: merge wait %v, timeout %v", ErrInvalid, s.mergeWait, s.timeout)
	}
	if !s.observed {
		s.observer = observe.ObserverOf(store)
	}
	s.merge.init(s)
	return s, nil
}

// Level is an item's units: what was put, and how much of it is free, held
// and sold. Free + Held + Sold == Put, always.
type Level struct {
	Put, Free, Held, Sold int64
}

// Sale answers a Take or a Confirm.
type Sale struct {
	Item, Key string
	Units     int64
	// Free is how many units of the item were free after the answer.
	Free int64
	// Replayed is true when the answer is the key's earlier one (a retry).
	Replayed bool
}

// Held answers a Hold.
type Held struct {
	Item, Key string
	Units     int64
	// Free is how many units of the item were free after the answer.
	Free int64
	// Deadline is when the hold ends unless confirmed, by this process's
	// clock (the store's clock decides; Deadline is now plus what the
	// store said was left).
	Deadline time.Time
	// Replayed is true when the answer is the key's earlier one (a retry).
	Replayed bool
}

// Put starts the item over (an item not seen before is created): units
// free, none sold; live holds are kept, and what was put is units plus
// them. The keys' answers are kept too: a retry still gets its first
// answer. Add changes the free units without starting over.
func (s *Stock) Put(ctx context.Context, item string, units int64) (Level, error) {
	_, lvl, err := s.adjust(ctx, stockdriver.Set, item, units)
	return lvl, err
}

// Add adds units free units to the item (an item not seen before is
// created); a negative units withdraws free units, and fails with
// ErrSoldOut, changing nothing, when fewer are free.
func (s *Stock) Add(ctx context.Context, item string, units int64) (Level, error) {
	res, lvl, err := s.adjust(ctx, stockdriver.Add, item, units)
	if err == nil && res.State == stockdriver.SoldOut {
		err = &SoldOutError{Item: item, Units: -units, Free: lvl.Free}
	}
	return lvl, err
}

func (s *Stock) adjust(ctx context.Context, kind stockdriver.Kind, item string, units int64) (stockdriver.Result, Level, error) {
	op := stockdriver.Op{Kind: kind, Units: units}
	if err := check(item, &op); err != nil {
		return stockdriver.Result{}, Level{}, err
	}
	a, err := s.store.ApplyStock(ctx, item, []stockdriver.Op{op})
	if err != nil {
		return stockdriver.Result{}, Level{}, storeErr(kind.String(), item, err)
	}
	s.expired(ctx, item, a.Expired)
	return a.Results[0], Level(a.Level), nil
}

// Level reads the item's units (holds that ran out are freed first).
func (s *Stock) Level(ctx context.Context, item string) (Level, error) {
	if err := checkName("item", item); err != nil {
		return Level{}, err
	}
	a, err := s.store.ApplyStock(ctx, item, nil)
	if err != nil {
		return Level{}, storeErr("level", item, err)
	}
	if !a.Exists {
		return Level{}, fmt.Errorf("%w: %q", ErrUnknownItem, item)
	}
	s.expired(ctx, item, a.Expired)
	return Level(a.Level), nil
}

// Take takes units free units of the item for key and sells them, or fails
// with a *SoldOutError (ErrSoldOut) when fewer are free, taking nothing.
// Either answer is the key's: a retry with the same key (for the memory
// set by WithMemory) gets it again, with Replayed set, and takes nothing
// more; the units and the key's record are written in one atomic step of
// the store, so a process that dies after it leaves an answer, not a
// half-done take.
//
// An empty key is the key of the idem.Guard run ctx belongs to
// (idem.KeyFrom): inside a run, a take is then once per request, and a
// retry after a crash between the take and the request's record finds the
// take's answer.
//
// Concurrent operations on one item are merged into one store call (see
// WithMaxMerge); each still gets its own answer.
func (s *Stock) Take(ctx context.Context, item, key string, units int64) (Sale, error) {
	res, lvl, key, err := s.do(ctx, item, stockdriver.Op{Kind: stockdriver.Take, Key: key, Units: units})
	if err != nil {
		return Sale{}, err
	}
	return s.sale(item, key, res, lvl)
}

// Hold holds units free units of the item for key until ttl has passed,
// or fails with a *SoldOutError (ErrSoldOut), holding nothing. Confirm
// sells the held units; Release, or the ttl running out (by the store's
// clock), frees them, exactly once, whether or not the holder's process is
// still alive. Like Take's, the answer is the key's: a retry gets it again
// (with the deadline it had), and an empty key is the Guard run's.
func (s *Stock) Hold(ctx context.Context, item, key string, units int64, ttl time.Duration) (Held, error) {
	res, lvl, key, err := s.do(ctx, item, stockdriver.Op{Kind: stockdriver.Hold, Key: key, Units: units, TTL: ttl})
	if err != nil {
		return Held{}, err
	}
	switch res.State {
	case stockdriver.Held:
		return Held{Item: item, Key: key, Units: res.Units, Free: lvl.Free, Deadline: time.Now().Add(res.Remaining), Replayed: res.Replayed}, nil
	case stockdriver.Sold:
		// Held and confirmed since: the retry's hold is a sale now.
		return Held{Item: item, Key: key, Units: res.Units, Free: lvl.Free, Replayed: true}, fmt.Errorf("stock: hold %q of %q: %w", key, item, ErrSold)
	}
	return Held{}, s.refusal(item, key, res, lvl)
}

// Confirm sells the units key holds on the item. It fails with
// ErrHoldExpired when the hold ran out first (its units were freed),
// ErrHoldReleased after a Release, ErrNoHold when key holds nothing there.
// A second Confirm gets the first one's Sale, with Replayed set.
func (s *Stock) Confirm(ctx context.Context, item, key string) (Sale, error) {
	res, lvl, key, err := s.do(ctx, item, stockdriver.Op{Kind: stockdriver.Confirm, Key: key})
	if err != nil {
		return Sale{}, err
	}
	return s.sale(item, key, res, lvl)
}

// Release frees the units key holds on the item. Releasing a hold that
// was released or ran out is not an error (the units are free either way);
// releasing a confirmed one fails with ErrSold, and a key that holds
// nothing there with ErrNoHold.
func (s *Stock) Release(ctx context.Context, item, key string) error {
	res, lvl, key, err := s.do(ctx, item, stockdriver.Op{Kind: stockdriver.Release, Key: key})
	if err != nil {
		return err
	}
	switch res.State {
	case stockdriver.Released, stockdriver.Expired:
		return nil
	case stockdriver.Sold:
		return fmt.Errorf("stock: release %q of %q: %w", key, item, ErrSold)
	}
	return s.refusal(item, key, res, lvl)
}

func (s *Stock) sale(item, key string, res stockdriver.Result, lvl stockdriver.Level) (Sale, error) {
	if res.State == stockdriver.Sold {
		return Sale{Item: item, Key: key, Units: res.Units, Free: lvl.Free, Replayed: res.Replayed}, nil
	}
	return Sale{}, s.refusal(item, key, res, lvl)
}

// refusal is the error of an answer that is not the one asked for.
func (s *Stock) refusal(item, key string, res stockdriver.Result, lvl stockdriver.Level) error {
	var err error
	switch res.State {
	case stockdriver.SoldOut:
		return &SoldOutError{Item: item, Units: res.Units, Free: lvl.Free, Replayed: res.Replayed}
	case stockdriver.Expired:
		err = ErrHoldExpired
	case stockdriver.Released:
		err = ErrHoldReleased
	case stockdriver.None:
		err = ErrNoHold
	case stockdriver.NoItem:
		return fmt.Errorf("%w: %q", ErrUnknownItem, item)
	case stockdriver.Mismatch:
		err = ErrMismatch
	case stockdriver.Held:
		err = fmt.Errorf("%w: the key holds %d units, not yet confirmed", ErrMismatch, res.Units)
	default:
		err = fmt.Errorf("%w: unexpected answer %v", ErrStore, res.State)
	}
	return fmt.Errorf("stock: %q of %q: %w", key, item, err)
}

// do checks op, runs it (merged with others on the item) and reports it.
func (s *Stock) do(ctx context.Context, item string, op stockdriver.Op) (stockdriver.Result, stockdriver.Level, string, error) {
	if op.Key == "" {
		op.Key, _ = idem.KeyFrom(ctx)
	}
	if op.Kind == stockdriver.Take || op.Kind == stockdriver.Hold {
		op.Keep = s.memory
	}
	ctx, call := observe.Begin(ctx, s.observer, opName(op.Kind), s.driver, item)
	if err := check(item, &op); err != nil {
		call.End(observe.Invalid, 0, err)
		return stockdriver.Result{}, stockdriver.Level{}, op.Key, err
	}
	res, lvl, err := s.merge.do(ctx, item, op)
	if err != nil {
		err = storeErr(op.Kind.String(), item, err)
		call.End(observe.Error, 0, err)
		return res, lvl, op.Key, err
	}
	call.End(outcome(res), 0, nil)
	return res, lvl, op.Key, nil
}

func opName(k stockdriver.Kind) observe.Op {
	switch k {
	case stockdriver.Take:
		return observe.StockTake
	case stockdriver.Hold:
		return observe.StockHold
	case stockdriver.Confirm:
		return observe.StockConfirm
	}
	return observe.StockRelease
}

func outcome(res stockdriver.Result) observe.Outcome {
	if res.Replayed {
		return observe.Replayed
	}
	switch res.State {
	case stockdriver.Sold:
		return observe.Sold
	case stockdriver.Held:
		return observe.Held
	case stockdriver.SoldOut:
		return observe.SoldOut
	case stockdriver.Released:
		return observe.Released
	case stockdriver.Expired:
		return observe.Expired
	case stockdriver.Mismatch:
		return observe.Mismatch
	}
	return observe.Invalid
}

// expired reports n holds of item that ran out.
func (s *Stock) expired(ctx context.Context, item string, n int) {
	if n > 0 && s.observer != nil {
		s.observer.Record(ctx, observe.Event{Op: observe.StockExpired, Driver: s.driver, Key: item, Outcome: observe.Expired, Count: n})
	}
}

func check(item string, op *stockdriver.Op) error {
	if err := checkName("item", item); err != nil {
		return err
	}
	if op.Kind != stockdriver.Add && op.Kind != stockdriver.Set {
		if err := checkName("key", op.Key); err != nil {
			return err
		}
	}
	if err := stockdriver.Check(*op); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	return nil
}

func checkName(what, name string) error {
	if err := lockdriver.ValidateKey(name); err != nil {
		return fmt.Errorf("%w: %s %q: %v", ErrInvalid, what, name, err)
	}
	return nil
}

func storeErr(op, item string, err error) error {
	if errors.Is(err, ErrStore) {
		return err
	}
	return fmt.Errorf("stock: %s %q: %w: %w", op, item, ErrStore, err)
}
