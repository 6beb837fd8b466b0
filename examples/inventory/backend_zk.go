package inventory

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/go-zookeeper/zk"

	"github.com/oncekit/oncekit/storage/zkstore"
)

// ZooKeeper is the inventory in znodes, beside zkstore's records: a sale's
// writes join the multi-operation transaction that completes its record
// (zkstore.Effect). Under /oncekit-inventory/<prefix>: item/s-{sku} (JSON
// with the fence; its version is the sale's condition), order/o-{id},
// outbox/o-{id}, shipment/o-{id}.
type ZooKeeper struct {
	c    *zk.Conn
	base string
}

// NewZooKeeper returns the inventory on c, creating its directories.
func NewZooKeeper(c *zk.Conn, prefix string) (*ZooKeeper, error) {
	z := &ZooKeeper{c: c, base: "/oncekit-inventory/" + strings.NewReplacer("/", "_", "\x00", "_").Replace(prefix+"x")}
	for _, p := range []string{"/oncekit-inventory", z.base, z.base + "/item", z.base + "/order", z.base + "/outbox", z.base + "/shipment"} {
		if _, err := c.Create(p, nil, 0, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return nil, fmt.Errorf("inventory: create %s: %w", p, err)
		}
	}
	return z, nil
}

func (z *ZooKeeper) item(sku string) string    { return z.base + "/item/s-" + sku }
func (z *ZooKeeper) order(id string) string    { return z.base + "/order/o-" + id }
func (z *ZooKeeper) outbox(id string) string   { return z.base + "/outbox/o-" + id }
func (z *ZooKeeper) shipment(id string) string { return z.base + "/shipment/o-" + id }

var zkACL = zk.WorldACL(zk.PermAll)

// get reads sku's item and its version (-1: none).
func (z *ZooKeeper) get(sku string) (etcdItem, int32, error) {
	b, st, err := z.c.Get(z.item(sku))
	if errors.Is(err, zk.ErrNoNode) {
		return etcdItem{}, -1, nil
	}
	if err != nil {
		return etcdItem{}, 0, err
	}
	var it etcdItem
	if err := json.Unmarshal(b, &it); err != nil {
		return etcdItem{}, 0, fmt.Errorf("inventory: corrupt item %q: %w", sku, err)
	}
	return it, st.Version, nil
}

func (z *ZooKeeper) PutItem(_ context.Context, sku string, stock int64, fence uint64) (Item, error) {
	old, version, err := z.get(sku)
	if err != nil {
		return Item{}, err
	}
	if version >= 0 && old.Fence >= fence {
		return Item{}, ErrStaleFence
	}
	b, _ := json.Marshal(etcdItem{Stock: stock, Fence: fence})
	if version < 0 {
		_, err = z.c.Create(z.item(sku), b, 0, zkACL)
	} else {
		_, err = z.c.Set(z.item(sku), b, version)
	}
	if errors.Is(err, zk.ErrNodeExists) || errors.Is(err, zk.ErrBadVersion) {
		return Item{}, ErrStaleFence // written meanwhile by a later holder
	}
	if err != nil {
		return Item{}, err
	}
	return Item{SKU: sku, Stock: stock}, nil
}

func (z *ZooKeeper) Item(_ context.Context, sku string) (Item, error) {
	// A ZooKeeper server answers reads from its own copy, which may lag
	// the leader: sync it first, so that a read sees every sale that
	// was answered before it began (linearizable reads).
	if _, err := z.c.Sync(z.item(sku)); err != nil && !errors.Is(err, zk.ErrNoNode) {
		return Item{}, err
	}
	it, version, err := z.get(sku)
	if err != nil {
		return Item{}, err
	}
	if version < 0 {
		return Item{}, ErrUnknownSKU
	}
	return Item{SKU: sku, Stock: it.Stock, Sold: it.Sold}, nil
}

func (z *ZooKeeper) Order(_ context.Context, id string) (Order, error) {
	b, _, err := z.c.Get(z.order(id))
	if errors.Is(err, zk.ErrNoNode) {
		return Order{}, ErrUnknownOrder
	}
	if err != nil {
		return Order{}, err
	}
	var o Order
	if err := json.Unmarshal(b, &o); err != nil {
		return Order{}, fmt.Errorf("inventory: corrupt order %q: %w", id, err)
	}
	return o, nil
}

// LockFree is false: a sale commits only if the item did not change since
// it was read, so unlocked sales of one SKU would refuse each other.
func (z *ZooKeeper) LockFree() bool { return false }

func (z *ZooKeeper) Sell(_ context.Context, o Order, lockFence uint64) (any, error) {
	it, version, err := z.get(o.SKU)
	switch {
	case err != nil:
		return nil, err
	case version < 0:
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
	// The item's version as read is the condition: a write since (a later
	// holder's) refuses the sale.
	return zkstore.Effect{
		Ops: []any{
			&zk.SetDataRequest{Path: z.item(o.SKU), Data: item, Version: version},
			&zk.CreateRequest{Path: z.order(o.OrderID), Data: order, Acl: zkACL},
			&zk.CreateRequest{Path: z.outbox(o.OrderID), Data: order, Acl: zkACL},
		},
		Reason: "stale_fence",
	}, nil
}

func (z *ZooKeeper) Outbox(_ context.Context, n int) ([]Order, error) {
	kids, _, err := z.c.Children(z.base + "/outbox")
	if err != nil {
		return nil, err
	}
	sort.Strings(kids)
	out := make([]Order, 0, min(n, len(kids)))
	for _, k := range kids[:min(n, len(kids))] {
		b, _, err := z.c.Get(z.base + "/outbox/" + k)
		if errors.Is(err, zk.ErrNoNode) {
			continue // published meanwhile
		}
		if err != nil {
			return nil, err
		}
		var o Order
		if err := json.Unmarshal(b, &o); err != nil {
			return nil, fmt.Errorf("inventory: corrupt outbox entry %q: %w", k, err)
		}
		out = append(out, o)
	}
	return out, nil
}

func (z *ZooKeeper) Published(_ context.Context, orders []Order) error {
	ids := orderIDs(orders)
	for _, id := range ids {
		if err := z.c.Delete(z.outbox(id), -1); err != nil && !errors.Is(err, zk.ErrNoNode) {
			return err
		}
	}
	return nil
}

func (z *ZooKeeper) Ship(_ context.Context, o Order) (any, error) {
	id := o.OrderID
	return zkstore.Effect{Ops: []any{&zk.CreateRequest{Path: z.shipment(id), Data: []byte("1"), Acl: zkACL}}}, nil
}

func (z *ZooKeeper) Counts(context.Context) (int64, int64, error) {
	_, o, err := z.c.Exists(z.base + "/order")
	if err != nil {
		return 0, 0, err
	}
	_, s, err := z.c.Exists(z.base + "/shipment")
	if err != nil {
		return 0, 0, err
	}
	return int64(o.NumChildren), int64(s.NumChildren), nil
}
