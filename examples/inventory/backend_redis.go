package inventory

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/storage/redisstore"
)

// Redis is the inventory in Redis, one server or a Cluster. With the
// redisstore driver it lives on the records' servers and its effects
// (redisstore.Effect) run in the script that completes the record; on a
// Cluster each order's record is placed in its SKU's slot (the service
// places orders by SKU: httpmw.WithPlacement), beside the keys the order
// writes. With Redlock, whose records are spread over several servers, it
// lives on one of them (or another): Record and Ship then write at once,
// keyed on the order's ID, and refuse a second order of one ID themselves
// (NewRedisKeyed).
//
// Keys, under a prefix, all of one SKU in the slot of the hash tag {sku}:
// order:{sku}:<id>, orders:{sku} (a counter), outbox:{sku} (a hash of
// pending events), shipments:{sku} (a hash); and skus, the set of SKUs
// ever stocked (for the counts and the outbox relay).
type Redis struct {
	Stocked
	c      redis.UniversalClient
	prefix string
	keyed  bool
}

// NewRedis returns the inventory on c, its stock in st, committed with
// redisstore records.
func NewRedis(st Stocked, c redis.UniversalClient, prefix string) *Redis {
	return &Redis{Stocked: st, c: c, prefix: prefix}
}

// NewRedisKeyed returns the inventory on c, its stock in st, for records
// that live elsewhere (Redlock): orders and shipments are keyed on the
// order's ID.
func NewRedisKeyed(st Stocked, c redis.UniversalClient, prefix string) *Redis {
	return &Redis{Stocked: st, c: c, prefix: prefix, keyed: true}
}

func (r *Redis) tagged(name, sku string) string { return r.prefix + name + ":{" + sku + "}" }
func (r *Redis) order(sku, id string) string    { return r.tagged("order", sku) + ":" + id }
func (r *Redis) orders(sku string) string       { return r.tagged("orders", sku) }
func (r *Redis) outbox(sku string) string       { return r.tagged("outbox", sku) }
func (r *Redis) shipments(sku string) string    { return r.tagged("shipments", sku) }
func (r *Redis) skus() string                   { return r.prefix + "skus" }

// PutItem stocks sku, which joins the set of SKUs first: a SKU with stock
// is always counted.
func (r *Redis) PutItem(ctx context.Context, sku string, stock int64) (Item, error) {
	if err := r.c.SAdd(ctx, r.skus(), sku).Err(); err != nil {
		return Item{}, err
	}
	return r.Stocked.PutItem(ctx, sku, stock)
}

func (r *Redis) Order(ctx context.Context, id string) (Order, error) {
	sku, ok := SKUOf(id)
	if !ok {
		return Order{}, ErrUnknownOrder
	}
	b, err := r.c.Get(ctx, r.order(sku, id)).Bytes()
	if errors.Is(err, redis.Nil) {
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

// recordLua records an order: KEYS order, orders, outbox; ARGV the
// order's JSON, its ID.
const recordLua = `
redis.call('SET', KEYS[1], ARGV[1])
redis.call('INCR', KEYS[2])
redis.call('HSET', KEYS[3], ARGV[2], ARGV[1])
`

// record is the effect committed with the record (redisstore).
var record = redisstore.NewEffectScript(recordLua)

// recordKeyed records an order at most once: a second run for one order
// (a retry after a replica died between the order and its record) finds
// it and writes nothing.
var recordKeyed = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 1 then return 'ok' end` + recordLua + `
return 'ok'`)

func (r *Redis) Record(ctx context.Context, o Order) (any, error) {
	body, err := json.Marshal(o)
	if err != nil {
		return nil, err
	}
	keys := []string{r.order(o.SKU, o.OrderID), r.orders(o.SKU), r.outbox(o.SKU)}
	if r.keyed {
		return nil, recordKeyed.Run(ctx, r.c, keys, body, o.OrderID).Err()
	}
	return redisstore.Effect{Script: record, Keys: keys, Args: []any{body, o.OrderID}}, nil
}

// Outbox reads the SKUs' outboxes in turn.
func (r *Redis) Outbox(ctx context.Context, n int) ([]Order, error) {
	skus, err := r.c.SMembers(ctx, r.skus()).Result()
	if err != nil {
		return nil, err
	}
	var out []Order
	for _, sku := range skus {
		var cursor uint64
		for len(out) < n {
			kv, next, err := r.c.HScan(ctx, r.outbox(sku), cursor, "*", int64(n)).Result()
			if err != nil {
				return nil, err
			}
			for i := 1; i < len(kv) && len(out) < n; i += 2 {
				var o Order
				if err := json.Unmarshal([]byte(kv[i]), &o); err != nil {
					return nil, fmt.Errorf("inventory: corrupt outbox entry %q: %w", kv[i-1], err)
				}
				out = append(out, o)
			}
			if cursor = next; cursor == 0 {
				break
			}
		}
	}
	return out, nil
}

func (r *Redis) Published(ctx context.Context, orders []Order) error {
	_, err := r.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, o := range orders {
			p.HDel(ctx, r.outbox(o.SKU), o.OrderID)
		}
		return nil
	})
	return err
}

var ship = redisstore.NewEffectScript(`redis.call('HSET', KEYS[1], ARGV[1], 1)`)

// Ship records the shipment in the SKU's hash: with the message's record
// (the shipping consumer places it by SKU), or at once, keyed on the
// order's ID, with Redlock.
func (r *Redis) Ship(ctx context.Context, o Order) (any, error) {
	if r.keyed {
		return nil, r.c.HSetNX(ctx, r.shipments(o.SKU), o.OrderID, 1).Err()
	}
	return redisstore.Effect{Script: ship, Keys: []string{r.shipments(o.SKU)}, Args: []any{o.OrderID}}, nil
}

// Counts sums the SKUs' counters.
func (r *Redis) Counts(ctx context.Context) (int64, int64, error) {
	skus, err := r.c.SMembers(ctx, r.skus()).Result()
	if err != nil {
		return 0, 0, err
	}
	ords := make([]*redis.StringCmd, len(skus))
	ships := make([]*redis.IntCmd, len(skus))
	_, err = r.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, sku := range skus {
			ords[i], ships[i] = p.Get(ctx, r.orders(sku)), p.HLen(ctx, r.shipments(sku))
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return 0, 0, err
	}
	var orders, shipments int64
	for i := range skus {
		n, err := ords[i].Int64()
		if err != nil && !errors.Is(err, redis.Nil) {
			return 0, 0, err
		}
		orders, shipments = orders+n, shipments+ships[i].Val()
	}
	return orders, shipments, nil
}
