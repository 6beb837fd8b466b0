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

// Redis is the inventory in Redis. With the redisstore driver it lives on
// the records' server and its effects (redisstore.Effect) run in the script
// that completes the record. With Redlock, whose records are spread over
// several servers, it lives on one of them (or another): Sell and Ship
// then write at once, keyed on the order's ID, and refuse a second sale of
// one order themselves (NewRedisKeyed).
//
// Keys, under a prefix: item:{sku} (a hash: stock, sold, fence),
// order:{id}, orders (a counter), outbox (a hash of pending events),
// shipments (a hash). One Redis server, or a Cluster's records and these
// keys would not share a slot: the example does not run on Cluster.
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

func (r *Redis) item(sku string) string { return r.prefix + "item:{" + sku + "}" }
func (r *Redis) order(id string) string { return r.prefix + "order:" + id }
func (r *Redis) orders() string         { return r.prefix + "orders" }
func (r *Redis) outbox() string         { return r.prefix + "outbox" }
func (r *Redis) shipments() string      { return r.prefix + "shipments" }

var putItem = redis.NewScript(`
local f = redis.call('HGET', KEYS[1], 'fence')
if f and tonumber(f) >= tonumber(ARGV[2]) then return 'stale' end
redis.call('HSET', KEYS[1], 'stock', ARGV[1], 'sold', 0, 'fence', ARGV[2])
return 'ok'`)

func (r *Redis) PutItem(ctx context.Context, sku string, stock int64, fence uint64) (Item, error) {
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
	b, err := r.c.Get(ctx, r.order(id)).Bytes()
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
	keys := []string{r.item(o.SKU), r.order(o.OrderID), r.orders(), r.outbox()}
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

func (r *Redis) Outbox(ctx context.Context, n int) ([]Order, error) {
	var out []Order
	var cursor uint64
	for len(out) < n {
		kv, next, err := r.c.HScan(ctx, r.outbox(), cursor, "*", int64(n)).Result()
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
	return out, nil
}

func (r *Redis) Published(ctx context.Context, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	return r.c.HDel(ctx, r.outbox(), ids...).Err()
}

var ship = redisstore.NewEffectScript(`redis.call('HSET', KEYS[1], ARGV[1], 1)`)

func (r *Redis) Ship(ctx context.Context, id string) (any, error) {
	if r.keyed {
		return nil, r.c.HSetNX(ctx, r.shipments(), id, 1).Err()
	}
	return redisstore.Effect{Script: ship, Keys: []string{r.shipments()}, Args: []any{id}}, nil
}

func (r *Redis) Counts(ctx context.Context) (int64, int64, error) {
	orders, err := r.c.Get(ctx, r.orders()).Int64()
	if errors.Is(err, redis.Nil) {
		err = nil
	}
	if err != nil {
		return 0, 0, err
	}
	shipments, err := r.c.HLen(ctx, r.shipments()).Result()
	return orders, shipments, err
}
