package inventory

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/storage/redisstore"
)

// Redis is the inventory in Redis, one server or a Cluster. With the
// redisstore driver it lives on the records' servers and its effects
// (redisstore.Effect) run in the script that completes the record; on a
// Cluster each sale's record is placed in its SKU's slot (the service
// places orders by SKU: httpmw.WithPlacement), beside the keys the sale
// writes. With Redlock, whose records are spread over several servers, it
// lives on one of them (or another): Sell and Ship then write at once,
// keyed on the order's ID, and refuse a second sale of one order
// themselves (NewRedisKeyed).
//
// Keys, under a prefix, all of one SKU in the slot of the hash tag {sku}:
// item:{sku} (a hash: stock, sold, fence), order:{sku}:<id>, orders:{sku}
// (a counter), outbox:{sku} (a hash of pending events), shipments:{sku}
// (a hash); and skus, the set of SKUs ever stocked (for the counts and
// the outbox relay).
type Redis struct {
	c      redis.UniversalClient
	prefix string
	keyed  bool
}

// NewRedis returns the inventory on c, committed with redisstore records.
func NewRedis(c redis.UniversalClient, prefix string) *Redis {
	return &Redis{c: c, prefix: prefix}
}

// NewRedisKeyed returns the inventory on c for records that live elsewhere
// (Redlock): sales and shipments are keyed on the order's ID.
func NewRedisKeyed(c redis.UniversalClient, prefix string) *Redis {
	return &Redis{c: c, prefix: prefix, keyed: true}
}

func (r *Redis) tagged(name, sku string) string { return r.prefix + name + ":{" + sku + "}" }
func (r *Redis) item(sku string) string         { return r.tagged("item", sku) }
func (r *Redis) order(sku, id string) string    { return r.tagged("order", sku) + ":" + id }
func (r *Redis) orders(sku string) string       { return r.tagged("orders", sku) }
func (r *Redis) outbox(sku string) string       { return r.tagged("outbox", sku) }
func (r *Redis) shipments(sku string) string    { return r.tagged("shipments", sku) }
func (r *Redis) skus() string                   { return r.prefix + "skus" }

var putItem = redis.NewScript(`
local f = redis.call('HGET', KEYS[1], 'fence')
if f and tonumber(f) >= tonumber(ARGV[2]) then return 'stale' end
redis.call('HSET', KEYS[1], 'stock', ARGV[1], 'sold', 0, 'fence', ARGV[2])
return 'ok'`)

func (r *Redis) PutItem(ctx context.Context, sku string, stock int64, fence uint64) (Item, error) {
	// The SKU joins the set first: a SKU with stock is always counted.
	if err := r.c.SAdd(ctx, r.skus(), sku).Err(); err != nil {
		return Item{}, err
	}
	res, err := putItem.Run(ctx, r.c, []string{r.item(sku)}, stock, fence).Text()
	if err != nil {
		return Item{}, err
	}
	if res == "stale" {
		return Item{}, ErrStaleFence
	}
	return Item{SKU: sku, Stock: stock}, nil
}

func (r *Redis) Item(ctx context.Context, sku string) (Item, error) {
	v, err := r.c.HMGet(ctx, r.item(sku), "stock", "sold").Result()
	if err != nil {
		return Item{}, err
	}
	if v[0] == nil {
		return Item{}, ErrUnknownSKU
	}
	stock, err1 := strconv.ParseInt(v[0].(string), 10, 64)
	sold, err2 := strconv.ParseInt(fmt.Sprint(v[1]), 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return Item{}, fmt.Errorf("inventory: corrupt item %q: %w", sku, err)
	}
	return Item{SKU: sku, Stock: stock, Sold: sold}, nil
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

// sellLua checks and sells: KEYS item, order, orders, outbox; ARGV qty,
// the SKU lock's fence (0: no lock), the order's JSON, its ID. It refuses
// with a reason (nil: sold).
const sellLua = `
local st = redis.call('HMGET', KEYS[1], 'stock', 'fence')
if not st[1] then return 'unknown_sku' end
local fenced = ARGV[2] ~= '0'
if fenced and st[2] and tonumber(st[2]) >= tonumber(ARGV[2]) then return 'stale_fence' end
if tonumber(st[1]) < tonumber(ARGV[1]) then return 'sold_out' end
redis.call('HINCRBY', KEYS[1], 'stock', -tonumber(ARGV[1]))
redis.call('HINCRBY', KEYS[1], 'sold', tonumber(ARGV[1]))
if fenced then redis.call('HSET', KEYS[1], 'fence', ARGV[2]) end
redis.call('SET', KEYS[2], ARGV[3])
redis.call('INCR', KEYS[3])
redis.call('HSET', KEYS[4], ARGV[4], ARGV[3])
`

// sell is the effect committed with the record (redisstore).
var sell = redisstore.NewEffectScript(sellLua)

// sellKeyed sells at most once per order: a second run for one order (a
// retry after a replica died between the sale and its record) finds the
// order and sells nothing.
var sellKeyed = redis.NewScript(`
local function effect(KEYS, ARGV)` + sellLua + `
end
if redis.call('EXISTS', KEYS[2]) == 1 then return 'ok' end
return effect(KEYS, ARGV) or 'ok'`)

// LockFree is true: the sale script checks and takes the stock atomically.
func (r *Redis) LockFree() bool { return true }

func (r *Redis) Sell(ctx context.Context, o Order, lockFence uint64) (any, error) {
	body, err := json.Marshal(o)
	if err != nil {
		return nil, err
	}
	keys := []string{r.item(o.SKU), r.order(o.SKU, o.OrderID), r.orders(o.SKU), r.outbox(o.SKU)}
	args := []any{o.Qty, lockFence, body, o.OrderID}
	if r.keyed {
		res, err := sellKeyed.Run(ctx, r.c, keys, args...).Text()
		if err != nil {
			return nil, err
		}
		return nil, refusal(res)
	}
	// Checked first, so that a sale that cannot happen is an answer (409
	// sold_out, stored) rather than a refused commit; checked again in the
	// script, atomically with the record.
	v, err := r.c.HMGet(ctx, r.item(o.SKU), "stock", "fence").Result()
	if err != nil {
		return nil, err
	}
	switch {
	case v[0] == nil:
		return nil, ErrUnknownSKU
	case lockFence != 0 && v[1] != nil && atoi(v[1]) >= int64(lockFence):
		return nil, ErrStaleFence
	case atoi(v[0]) < o.Qty:
		return nil, ErrSoldOut
	}
	return redisstore.Effect{Script: sell, Keys: keys, Args: args}, nil
}

func atoi(v any) int64 {
	n, _ := strconv.ParseInt(fmt.Sprint(v), 10, 64)
	return n
}

func refusal(reason string) error {
	switch reason {
	case "ok":
		return nil
	case "unknown_sku":
		return ErrUnknownSKU
	case "stale_fence":
		return ErrStaleFence
	case "sold_out":
		return ErrSoldOut
	}
	return fmt.Errorf("inventory: unexpected script reply %q", reason)
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
