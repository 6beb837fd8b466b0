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
	Stocked
	mu        sync.Mutex
	orders    map[string]Order
	outbox    map[string]Order
	shipments map[string]bool
}

// NewMemory returns an empty inventory whose stock is kept in st.
func NewMemory(st Stocked) *Memory {
	return &Memory{Stocked: st, orders: map[string]Order{}, outbox: map[string]Order{}, shipments: map[string]bool{}}
}

func (m *Memory) Order(_ context.Context, id string) (Order, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if o, ok := m.orders[id]; ok {
		return o, nil
	}
	return Order{}, ErrUnknownOrder
}

func (m *Memory) Record(_ context.Context, o Order) (any, error) {
	return memstore.Effect(func() error {
		m.mu.Lock()
		defer m.mu.Unlock()
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
