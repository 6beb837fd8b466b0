package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/lock"
)

// Shop is the flash sale's state: stock per SKU and the orders taken. It
// stands for a database: every write carries the fence of the lock under
// which it was decided, and a write with a stale fence is refused.
type Shop struct {
	fences lock.FenceGate

	mu     sync.Mutex
	stock  map[string]int
	orders map[string]string // order ID -> SKU

	executions sync.Map // order ID -> *atomic.Int64: times the purchase ran
}

// NewShop returns a shop holding qty units of sku.
func NewShop(sku string, qty int) *Shop {
	return &Shop{stock: map[string]int{sku: qty}, orders: map[string]string{}}
}

// Outcome of one order submission.
type Outcome int

const (
	Bought    Outcome = iota // this submission bought the item
	Duplicate                // a replay: an earlier submission of the order ran
	SoldOut                  // no stock left
)

// Buy places orderID for one unit of sku, once, however often it is
// submitted and however many buyers compete. Two oncekit layers do it:
// the idempotency guard runs the purchase once per order ID and replays its
// outcome to every duplicate (duplicate consumption), and the SKU's lock
// serialises purchases of one item with a fenced write (order grabbing,
// no overselling).
func (s *Shop) Buy(ctx context.Context, g *idem.Guard, m *lock.Mutex, orderID, sku string) (Outcome, error) {
	key := idem.ScopedKey("flash-sale", orderID)
	res, replayed, err := g.Do(ctx, key, idem.Fingerprint([]byte(sku)), func(ctx context.Context) ([]byte, error) {
		var out []byte
		err := m.Do(ctx, "sku:"+sku, func(ctx context.Context, l lock.Lease) error {
			s.mu.Lock()
			left := s.stock[sku]
			s.mu.Unlock()
			if left <= 0 {
				out = []byte("sold-out")
				return nil
			}
			n, _ := s.executions.LoadOrStore(orderID, new(atomic.Int64))
			n.(*atomic.Int64).Add(1)
			out = []byte("bought")
			return s.commit(sku, orderID, left-1, l.Fence())
		})
		return out, err
	})
	switch {
	case err != nil:
		return 0, err
	case replayed:
		return Duplicate, nil
	case string(res) == "sold-out":
		return SoldOut, nil
	default:
		return Bought, nil
	}
}

// commit is the database write: refused when a newer lock holder has
// written since this one took the lock.
func (s *Shop) commit(sku, orderID string, left int, fence uint64) error {
	if err := s.fences.Admit(sku, fence); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stock[sku] = left
	s.orders[orderID] = sku
	return nil
}

// Report is what a sale ends with.
type Report struct {
	Buyers, Stock, Submissions int
	Sold, SoldOut, Duplicates  int // outcomes seen by submissions
	Oversold                   int // units sold beyond the stock (must be 0)
	DuplicateExecutions        int // purchases that ran more than once for one order (must be 0)
	Errors                     int
	Elapsed                    time.Duration
}

// OK reports whether every invariant held.
func (r Report) OK() bool {
	return r.Oversold == 0 && r.DuplicateExecutions == 0 && r.Errors == 0 &&
		r.Sold == min(r.Buyers, r.Stock)
}

func (r Report) String() string {
	verdict := "OK"
	if !r.OK() {
		verdict = "FAILED"
	}
	return fmt.Sprintf(`flash sale: %d buyers, stock %d, %d submissions (each order sent %d times at once)
  sold                  %d
  sold out              %d
  duplicates replayed   %d
  oversold              %d (must be 0)
  duplicate executions  %d (must be 0)
  errors                %d
  elapsed               %s
  %s`, r.Buyers, r.Stock, r.Submissions, r.Submissions/max(r.Buyers, 1),
		r.Sold, r.SoldOut, r.Duplicates, r.Oversold, r.DuplicateExecutions, r.Errors,
		r.Elapsed.Round(time.Millisecond), verdict)
}

// RunSale lets buyers goroutines each send their order 1+retries times at
// once (a client retrying with the same order ID) against stock units.
func RunSale(ctx context.Context, g *idem.Guard, m *lock.Mutex, buyers, stock, retries int) Report {
	const sku = "phone-x"
	shop := NewShop(sku, stock)
	var (
		wg                      sync.WaitGroup
		sold, soldOut, dup, bad atomic.Int64
	)
	start := time.Now()
	for b := range buyers {
		orderID := fmt.Sprintf("order-%04d-%d", b, start.UnixNano())
		for range 1 + retries {
			wg.Go(func() {
				out, err := shop.Buy(ctx, g, m, orderID, sku)
				switch {
				case err != nil:
					bad.Add(1)
				case out == Bought:
					sold.Add(1)
				case out == SoldOut:
					soldOut.Add(1)
				case out == Duplicate:
					dup.Add(1)
				}
			})
		}
	}
	wg.Wait()
	r := Report{
		Buyers: buyers, Stock: stock, Submissions: buyers * (1 + retries),
		Sold: int(sold.Load()), SoldOut: int(soldOut.Load()), Duplicates: int(dup.Load()),
		Errors: int(bad.Load()), Elapsed: time.Since(start),
	}
	r.Oversold = max(0, len(shop.orders)-stock)
	if shop.stock[sku] < 0 {
		r.Oversold = max(r.Oversold, -shop.stock[sku])
	}
	shop.executions.Range(func(_, v any) bool {
		r.DuplicateExecutions += int(v.(*atomic.Int64).Load()) - 1
		return true
	})
	if len(shop.orders) != r.Sold {
		r.Errors++ // outcomes and stored orders disagree
	}
	return r
}
