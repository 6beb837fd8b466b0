package inventory

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/oncekit/oncekit/storage/etcdstore"
)

// Etcd is the inventory in etcd, beside etcdstore's records: a sale's
// writes join the transaction that completes its record (etcdstore.Effect).
// Keys, under a prefix: item/{sku} (JSON with the fence), order/{id},
// outbox/{id}, shipment/{id}.
type Etcd struct {
	c      *clientv3.Client
	prefix string
}

// NewEtcd returns the inventory on c.
func NewEtcd(c *clientv3.Client, prefix string) *Etcd { return &Etcd{c: c, prefix: prefix} }

type etcdItem struct {
	Stock int64  `json:"stock"`
	Sold  int64  `json:"sold"`
	Fence uint64 `json:"fence"`
}

func (e *Etcd) item(sku string) string    { return e.prefix + "item/" + sku }
func (e *Etcd) order(id string) string    { return e.prefix + "order/" + id }
func (e *Etcd) outbox(id string) string   { return e.prefix + "outbox/" + id }
func (e *Etcd) shipment(id string) string { return e.prefix + "shipment/" + id }

// get reads sku's item and its revision (0: none).
func (e *Etcd) get(ctx context.Context, sku string) (etcdItem, int64, error) {
	resp, err := e.c.Get(ctx, e.item(sku))
	if err != nil {
		return etcdItem{}, 0, err
	}
	if len(resp.Kvs) == 0 {
		return etcdItem{}, 0, nil
	}
	var it etcdItem
	if err := json.Unmarshal(resp.Kvs[0].Value, &it); err != nil {
		return etcdItem{}, 0, fmt.Errorf("inventory: corrupt item %q: %w", sku, err)
	}
	return it, resp.Kvs[0].ModRevision, nil
}

func (e *Etcd) PutItem(ctx context.Context, sku string, stock int64, fence uint64) (Item, error) {
	old, rev, err := e.get(ctx, sku)
	if err != nil {
		return Item{}, err
	}
	if rev != 0 && old.Fence >= fence {
		return Item{}, ErrStaleFence
	}
	b, _ := json.Marshal(etcdItem{Stock: stock, Fence: fence})
	t, err := e.c.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(e.item(sku)), "=", rev)).
		Then(clientv3.OpPut(e.item(sku), string(b))).Commit()
	if err != nil {
		return Item{}, err
	}
	if !t.Succeeded {
		return Item{}, ErrStaleFence // written meanwhile by a later holder
	}
	return Item{SKU: sku, Stock: stock}, nil
}

func (e *Etcd) Item(ctx context.Context, sku string) (Item, error) {
	it, rev, err := e.get(ctx, sku)
	if err != nil {
		return Item{}, err
	}
	if rev == 0 {
		return Item{}, ErrUnknownSKU
	}
	return Item{SKU: sku, Stock: it.Stock, Sold: it.Sold}, nil
}

func (e *Etcd) Order(ctx context.Context, id string) (Order, error) {
	resp, err := e.c.Get(ctx, e.order(id))
	if err != nil {
		return Order{}, err
	}
	if len(resp.Kvs) == 0 {
		return Order{}, ErrUnknownOrder
	}
	var o Order
	if err := json.Unmarshal(resp.Kvs[0].Value, &o); err != nil {
		return Order{}, fmt.Errorf("inventory: corrupt order %q: %w", id, err)
	}
	return o, nil
}

// LockFree is false: a sale commits only if the item did not change since
// it was read, so unlocked sales of one SKU would refuse each other.
func (e *Etcd) LockFree() bool { return false }

func (e *Etcd) Sell(ctx context.Context, o Order, lockFence uint64) (any, error) {
	it, rev, err := e.get(ctx, o.SKU)
	switch {
	case err != nil:
		return nil, err
	case rev == 0:
		return nil, ErrUnknownSKU
	case it.Fence >= lockFence:
		return nil, ErrStaleFence
	case it.Stock < o.Qty:
		return nil, ErrSoldOut
	}
	it.Stock -= o.Qty
	it.Sold += o.Qty
	it.Fence = lockFence
	item, _ := json.Marshal(it)
	order, _ := json.Marshal(o)
	// The item as read is the condition: a write since (a later holder's)
	// refuses the sale.
	return etcdstore.Effect{
		If: []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(e.item(o.SKU)), "=", rev)},
		Then: []clientv3.Op{
			clientv3.OpPut(e.item(o.SKU), string(item)),
			clientv3.OpPut(e.order(o.OrderID), string(order)),
			clientv3.OpPut(e.outbox(o.OrderID), string(order)),
		},
		Reason: "stale_fence",
	}, nil
}

func (e *Etcd) Outbox(ctx context.Context, n int) ([]Order, error) {
	resp, err := e.c.Get(ctx, e.prefix+"outbox/", clientv3.WithPrefix(), clientv3.WithLimit(int64(n)))
	if err != nil {
		return nil, err
	}
	out := make([]Order, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		var o Order
		if err := json.Unmarshal(kv.Value, &o); err != nil {
			return nil, fmt.Errorf("inventory: corrupt outbox entry %q: %w", strings.TrimPrefix(string(kv.Key), e.prefix), err)
		}
		out = append(out, o)
	}
	return out, nil
}

func (e *Etcd) Published(ctx context.Context, orders []Order) error {
	ids := orderIDs(orders)
	if len(ids) == 0 {
		return nil
	}
	ops := make([]clientv3.Op, len(ids))
	for i, id := range ids {
		ops[i] = clientv3.OpDelete(e.outbox(id))
	}
	_, err := e.c.Txn(ctx).Then(ops...).Commit()
	return err
}

func (e *Etcd) Ship(_ context.Context, o Order) (any, error) {
	id := o.OrderID
	return etcdstore.Effect{Then: []clientv3.Op{clientv3.OpPut(e.shipment(id), "1")}}, nil
}

func (e *Etcd) Counts(ctx context.Context) (int64, int64, error) {
	o, err := e.c.Get(ctx, e.prefix+"order/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return 0, 0, err
	}
	s, err := e.c.Get(ctx, e.prefix+"shipment/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return 0, 0, err
	}
	return o.Count, s.Count, nil
}
