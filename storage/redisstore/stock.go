package redisstore

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/oncekit/oncekit/stock/stockdriver"
	"github.com/oncekit/oncekit/storage/internal/rediskit"
)

// ApplyStock implements stockdriver.Store (package stock): one script per
// call, by the server's clock. An item's keys share its hash tag, so on a
// Cluster they live in one slot: the hash <stock prefix>{item} (layout
// "S1": put, free, held, sold; WithStockPrefix), the sorted set
// <stock prefix>{item}:h of its live holds by deadline, and one string per
// key, <stock prefix>{item}:k:<key>, "S1|<t or h>|<state>|<units>|<deadline>"
// with the key's memory as its PTTL. An item lives until it is deleted;
// its records and holds end by themselves.
func (s *Store) ApplyStock(ctx context.Context, item string, ops []stockdriver.Op) (stockdriver.Answer, error) {
	if err := s.closedErr("stock", item); err != nil {
		return stockdriver.Answer{}, err
	}
	name := s.stockPrefix + "{" + rediskit.Tag(item) + "}"
	keys := make([]string, 2, 2+len(ops))
	keys[0], keys[1] = name, name+":h"
	args := make([]any, 1, 1+4*len(ops))
	args[0] = name + ":k:"
	for _, op := range ops {
		code := stockCodes[op.Kind]
		if code == "" {
			return stockdriver.Answer{}, fmt.Errorf("redisstore: stock op %v", op.Kind)
		}
		if op.Kind != stockdriver.Add && op.Kind != stockdriver.Set {
			keys = append(keys, name+":k:"+op.Key)
		}
		args = append(args, code, op.Units, op.TTL.Milliseconds(), op.Keep.Milliseconds())
	}
	v, err := s.base.RunScript(ctx, s.client, rediskit.Stock, keys, args...).Slice()
	if err != nil {
		if strings.Contains(err.Error(), "ONCEKIT_LAYOUT") {
			return stockdriver.Answer{}, fmt.Errorf("redisstore: stock %q: %w (%v)", item, stockdriver.ErrUnknownLayout, err)
		}
		return stockdriver.Answer{}, fmt.Errorf("redisstore: stock %q: %w", item, err)
	}
	return parseStock(v, len(ops))
}

var stockCodes = map[stockdriver.Kind]string{
	stockdriver.Take: "t", stockdriver.Hold: "h", stockdriver.Confirm: "c",
	stockdriver.Release: "r", stockdriver.Add: "a", stockdriver.Set: "s",
}

var stockStates = map[string]stockdriver.State{
	"n": stockdriver.None, "s": stockdriver.Sold, "h": stockdriver.Held, "o": stockdriver.SoldOut,
	"r": stockdriver.Released, "x": stockdriver.Expired, "i": stockdriver.NoItem, "m": stockdriver.Mismatch,
}

// parseStock reads the stock script's reply (see lua/stock.lua).
func parseStock(v []any, n int) (stockdriver.Answer, error) {
	if len(v) != 6+4*n {
		return stockdriver.Answer{}, fmt.Errorf("redisstore: stock reply of %d values for %d operations", len(v), n)
	}
	nums := make([]int64, len(v))
	for i, x := range v {
		if i >= 6 && (i-6)%4 == 0 {
			continue // a state
		}
		k, ok := x.(int64)
		if !ok {
			return stockdriver.Answer{}, fmt.Errorf("redisstore: stock reply %d is %T", i, x)
		}
		nums[i] = k
	}
	a := stockdriver.Answer{
		Exists:  nums[0] == 1,
		Level:   stockdriver.Level{Put: nums[1], Free: nums[2], Held: nums[3], Sold: nums[4]},
		Expired: int(nums[5]),
		Results: make([]stockdriver.Result, n),
	}
	for i := range n {
		b := 6 + 4*i
		code, _ := v[b].(string)
		st, ok := stockStates[code]
		if !ok {
			return stockdriver.Answer{}, fmt.Errorf("redisstore: stock reply state %q", v[b])
		}
		a.Results[i] = stockdriver.Result{State: st, Units: nums[b+1], Remaining: time.Duration(nums[b+2]) * time.Millisecond, Replayed: nums[b+3] == 1}
	}
	return a, nil
}

var _ stockdriver.Store = (*Store)(nil)
