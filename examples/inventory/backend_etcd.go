package inventory

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/oncekit/oncekit/storage/etcdstore"
)

// Etcd is the inventory in etcd, beside etcdstore's records: an order's
// writes join the transaction that completes its record (etcdstore.Effect).
// Keys, under a prefix: order/{id}, outbox/{id}, shipment/{id}.
type Etcd struct {
	Stocked
	c      *clientv3.Client
	prefix string
}

// NewEtcd returns the inventory on c, its stock in st.
func NewEtcd(st Stocked, c *clientv3.Client, prefix string) *Etcd {
	return &Etcd{Stocked: st, c: c, prefix: prefix}
}

func (e *Etcd) order(id string) string    { return e.prefix + "order/" + id }
func (e *Etcd) outbox(id string) string   { return e.prefix + "outbox/" + id }
func (e *Etcd) shipment(id string) string { return e.prefix + "shipment/" + id }

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

func (e *Etcd) Record(_ context.Context, o Order) (any, error) {
	order, _ := json.Marshal(o)
	return etcdstore.Effect{Then: []clientv3.Op{
		clientv3.OpPut(e.order(o.OrderID), string(order)),
		clientv3.OpPut(e.outbox(o.OrderID), string(order)),
	}}, nil
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
