package inventory

import (
	"context"
	"errors"
	"time"

	"github.com/oncekit/oncekit/stock"
)

// Stocked is the stock part of every Backend: package stock over the
// store (memory, Redis, etcd, SQL, ZooKeeper; a Redis server beside
// Redlock), the SKUs named under the inventory's prefix. The sale itself —
// never below zero, once per order — is the driver's.
type Stocked struct {
	st     *stock.Stock
	prefix string
}

// NewStocked keeps the stock in st, the SKUs named prefix+sku.
func NewStocked(st *stock.Stock, prefix string) Stocked { return Stocked{st: st, prefix: prefix} }

func (s Stocked) item(sku string) string { return s.prefix + sku }

func (s Stocked) PutItem(ctx context.Context, sku string, units int64) (Item, error) {
	l, err := s.st.Put(ctx, s.item(sku), units)
	if err != nil {
		return Item{}, err
	}
	return itemOf(sku, l), nil
}

func (s Stocked) Item(ctx context.Context, sku string) (Item, error) {
	l, err := s.st.Level(ctx, s.item(sku))
	if err != nil {
		return Item{}, stockErr(err)
	}
	return itemOf(sku, l), nil
}

func itemOf(sku string, l stock.Level) Item {
	return Item{SKU: sku, Stock: l.Free, Sold: l.Sold, Held: l.Held}
}

func (s Stocked) Take(ctx context.Context, o Order) error {
	_, err := s.st.Take(ctx, s.item(o.SKU), o.OrderID, o.Qty)
	return stockErr(err)
}

func (s Stocked) Hold(ctx context.Context, sku, id string, qty int64, ttl time.Duration) (time.Time, error) {
	h, err := s.st.Hold(ctx, s.item(sku), id, qty, ttl)
	return h.Deadline, stockErr(err)
}

func (s Stocked) ConfirmHold(ctx context.Context, sku, id string) (int64, error) {
	sale, err := s.st.Confirm(ctx, s.item(sku), id)
	return sale.Units, stockErr(err)
}

func (s Stocked) ReleaseHold(ctx context.Context, sku, id string) error {
	return stockErr(s.st.Release(ctx, s.item(sku), id))
}

// stockErr is the inventory's error for package stock's.
func stockErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, stock.ErrSoldOut):
		return errors.Join(ErrSoldOut, err)
	case errors.Is(err, stock.ErrUnknownItem):
		return errors.Join(ErrUnknownSKU, err)
	case errors.Is(err, stock.ErrHoldExpired):
		return errors.Join(ErrHoldExpired, err)
	case errors.Is(err, stock.ErrSold):
		return errors.Join(ErrHoldPaid, err)
	case errors.Is(err, stock.ErrNoHold), errors.Is(err, stock.ErrHoldReleased), errors.Is(err, stock.ErrMismatch):
		return errors.Join(ErrUnknownHold, err)
	}
	return err
}
