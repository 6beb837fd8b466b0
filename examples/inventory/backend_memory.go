package inventory

import (
	"context"
	"sort"
	"sync"

	"github.com/oncekit/oncekit/storage/memstore"
)

// Memory is the inventory in this process, beside a memstore: replicas in
// one process share it (the embedded demo). Its effects are
// memstore.Effect.
type Memory struct {
	mu        sync.Mutex
	items     map[string]*memItem
	orders    map[string]Order
	outbox    map[string]Order
	shipments map[string]bool
}

type memItem struct {
	Item
	fence uint64
}

// NewMemory returns an empty inventory.
func NewMemory() *Memory {
	return &Memory{items: map[string]*memItem{}, orders: map[string]Order{}, outbox: map[string]Order{}, shipments: map[string]bool{}}
}

func (m *Memory) PutItem(_ context.Context, sku string, stock int64, fence uint64) (Item, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if it := m.items[sku]; it != nil && it.fence >= fence {
		return Item{}, ErrStaleFence
	}
	it := &memItem{Item: Item{SKU: sku, Stock: stock}, fence: fence}
	m.items[sku] = it
	return it.Item, nil
}

func (m *Memory) Item(_ context.Context, sku string) (Item, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if it := m.items[sku]; it != nil {
		return it.Item, nil
	}
	return Item{}, ErrUnknownSKU
}

func (m *Memory) Order(_ context.Context, id string) (Order, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if o, ok := m.orders[id]; ok {
		return o, nil
	}
	return Order{}, ErrUnknownOrder
}

// check is the sale's condition, under m.mu.
func (m *Memory) check(o Order, lockFence uint64) error {
	it := m.items[o.SKU]
	switch {
	case it == nil:
		return ErrUnknownSKU
	case lockFence != 0 && it.fence >= lockFence:
		return ErrStaleFence
	case it.Stock < o.Qty:
		return ErrSoldOut
	}
	return nil
}

// LockFree is true: the effect checks and takes the stock under one lock.
func (m *Memory) LockFree() bool { return true }

func (m *Memory) Sell(_ context.Context, o Order, lockFence uint64) (any, error) {
	m.mu.Lock()
	err := m.check(o, lockFence)
	m.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return memstore.Effect(func() error {
		m.mu.Lock()
		defer m.mu.Unlock()
		if err := m.check(o, lockFence); err != nil {
			return err
		}
		it := m.items[o.SKU]
		it.Stock -= o.Qty
		it.Sold += o.Qty
		it.fence = max(it.fence, lockFence)
		m.orders[o.OrderID] = o
		m.outbox[o.OrderID] = o
		return nil
	}), nil
}

func (m *Memory) Outbox(_ context.Context, n int) ([]Order, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]Order, 0, min(n, len(m.outbox)))
	for _, o := range m.outbox {
		out = append(out, o)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].OrderID < out[j].OrderID })
	return out[:min(n, len(out))], nil
}

func (m *Memory) Published(_ context.Context, orders []Order) error {
	ids := orderIDs(orders)
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, id := range ids {
		delete(m.outbox, id)
	}
	return nil
}

func (m *Memory) Ship(_ context.Context, o Order) (any, error) {
	id := o.OrderID
	return memstore.Effect(func() error {
		m.mu.Lock()
		defer m.mu.Unlock()
		m.shipments[id] = true
		return nil
	}), nil
}

func (m *Memory) Counts(context.Context) (int64, int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return int64(len(m.orders)), int64(len(m.shipments)), nil
}
