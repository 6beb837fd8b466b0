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

// ZooKeeper is the inventory in znodes, beside zkstore's records: an
// order's writes join the multi-operation transaction that completes its
// record (zkstore.Effect). Under /oncekit-inventory/<prefix>: order/o-{id},
// outbox/o-{id}, shipment/o-{id}.
type ZooKeeper struct {
	Stocked
	c    *zk.Conn
	base string
}

// NewZooKeeper returns the inventory on c, its stock in st, creating its
// directories.
func NewZooKeeper(st Stocked, c *zk.Conn, prefix string) (*ZooKeeper, error) {
	z := &ZooKeeper{Stocked: st, c: c, base: "/oncekit-inventory/" + strings.NewReplacer("/", "_", "\x00", "_").Replace(prefix+"x")}
	for _, p := range []string{"/oncekit-inventory", z.base, z.base + "/order", z.base + "/outbox", z.base + "/shipment"} {
		if _, err := c.Create(p, nil, 0, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return nil, fmt.Errorf("inventory: create %s: %w", p, err)
		}
	}
	return z, nil
}

func (z *ZooKeeper) order(id string) string    { return z.base + "/order/o-" + id }
func (z *ZooKeeper) outbox(id string) string   { return z.base + "/outbox/o-" + id }
func (z *ZooKeeper) shipment(id string) string { return z.base + "/shipment/o-" + id }

var zkACL = zk.WorldACL(zk.PermAll)

func (z *ZooKeeper) Order(_ context.Context, id string) (Order, error) {
	// A ZooKeeper server answers reads from its own copy, which may lag
	// the leader: sync it first, so that an order answered is found.
	if _, err := z.c.Sync(z.order(id)); err != nil && !errors.Is(err, zk.ErrNoNode) {
		return Order{}, err
	}
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

func (z *ZooKeeper) Record(_ context.Context, o Order) (any, error) {
	order, _ := json.Marshal(o)
	return zkstore.Effect{Ops: []any{
		&zk.CreateRequest{Path: z.order(o.OrderID), Data: order, Acl: zkACL},
		&zk.CreateRequest{Path: z.outbox(o.OrderID), Data: order, Acl: zkACL},
	}}, nil
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
