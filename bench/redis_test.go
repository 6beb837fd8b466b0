package bench

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/internal/testenv"
)

// BenchmarkScriptServerTime: what a script's time inside Redis costs a
// caller on this machine, one request at a time. A Lua loop of n steps
// stands for a script's work; server-µs is its time in Redis (INFO
// commandstats), wall-p50-µs what the caller waits, against a PING
// measured in the same loop (ping-p50-µs). It is the yardstick for budgets
// stated in round trips (the HTTP and gRPC middleware's): a PING costs the
// server a fraction of a microsecond; oncekit's claim and completion
// scripts 10–20 µs each here.
func BenchmarkScriptServerTime(b *testing.B) {
	c, _ := client(b, testenv.RedisAddrs(b, 1)[0])
	ctx := context.Background()
	loop := redis.NewScript(`local x = 0 for i = 1, tonumber(ARGV[1]) do x = x + i end return x`)
	if err := loop.Load(ctx, c).Err(); err != nil {
		b.Fatal(err)
	}
	for _, n := range []int{0, 1000, 2000, 4000} {
		b.Run(fmt.Sprintf("loop-%d", n), func(b *testing.B) {
			usec0, calls0 := evalshaStats(b, c)
			var wall, ping []time.Duration
			for b.Loop() {
				start := time.Now()
				if err := loop.Run(ctx, c, nil, n).Err(); err != nil {
					b.Fatal(err)
				}
				wall = append(wall, time.Since(start))
				start = time.Now()
				if err := c.Ping(ctx).Err(); err != nil {
					b.Fatal(err)
				}
				ping = append(ping, time.Since(start))
			}
			usec, calls := evalshaStats(b, c)
			b.ReportMetric((usec-usec0)/(calls-calls0), "server-µs")
			b.ReportMetric(p50us(wall), "wall-p50-µs")
			b.ReportMetric(p50us(ping), "ping-p50-µs")
		})
	}
}

// evalshaStats returns the total microseconds and calls of EVALSHA so far
// on c's server.
func evalshaStats(b *testing.B, c *redis.Client) (usec, calls float64) {
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.Lines(info) {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_evalsha:")
		if !ok {
			continue
		}
		for field := range strings.SplitSeq(rest, ",") {
			k, v, _ := strings.Cut(field, "=")
			switch k {
			case "usec":
				usec, _ = strconv.ParseFloat(v, 64)
			case "calls":
				calls, _ = strconv.ParseFloat(v, 64)
			}
		}
	}
	return usec, calls
}

// BenchmarkScriptCost: what a script costs this Redis against plain
// commands, per cycle on a new key, in client and server CPU (see cycles);
// every cycle ends with an UNLINK of the key. "plain" is SET NX PX + SET PX
// (the Guard.Do control); "scripts" a claim and a completion shaped like
// oncekit's (TIME + SET NX GET PX; GET + SET PX); "empty" two scripts that
// only return; "keys-1" and "keys-3" the claim script alone, sent with one
// declared key and four arguments or with three keys and five (the
// script's work is the same).
func BenchmarkScriptCost(b *testing.B) {
	addr := testenv.RedisAddrs(b, 1)[0]
	claim := redis.NewScript(`local t = redis.call('TIME')
local c = tonumber(t[1]) * 1000000 + tonumber(t[2])
local p = redis.call('SET', KEYS[1], 'R1|i|' .. c .. '||' .. ARGV[1] .. '|2|fp', 'NX', 'GET', 'PX', ARGV[2])
if not p then return {1, c, c} end
return {0}`)
	complete := redis.NewScript(`local v = redis.call('GET', KEYS[1])
if v then redis.call('SET', KEYS[1], 'R1|c|' .. ARGV[1], 'PX', ARGV[2]) return 1 end
return 0`)
	empty := redis.NewScript(`return 1`)
	for _, workers := range []int{1, 16} {
		for _, mode := range []string{"plain", "scripts", "empty", "keys-1", "keys-3"} {
			b.Run(fmt.Sprintf("workers=%d/%s", workers, mode), func(b *testing.B) {
				cs := make([]*redis.Client, workers)
				ctx := context.Background()
				for w := range cs {
					cs[w], _ = client(b, addr)
					for _, s := range []*redis.Script{claim, complete, empty} {
						if err := s.Load(ctx, cs[w]).Err(); err != nil {
							b.Fatal(err)
						}
					}
				}
				prefix := benchKey("script-cost")
				cycles(b, []string{addr}, workers, func(w int, i int64) error {
					c, key := cs[w], prefix+":"+strconv.FormatInt(i, 10)
					switch mode {
					case "plain":
						if err := c.SetNX(ctx, key, "R1|i|1||tok|2|fp", 10*time.Second).Err(); err != nil {
							return err
						}
						if err := c.Set(ctx, key, `R1|c|tok{"order":1001}`, time.Minute).Err(); err != nil {
							return err
						}
					case "scripts":
						if err := claim.EvalSha(ctx, c, []string{key}, "tok", 10000).Err(); err != nil {
							return err
						}
						if err := complete.EvalSha(ctx, c, []string{key}, `tok{"order":1001}`, 60000).Err(); err != nil {
							return err
						}
					case "empty":
						if err := empty.EvalSha(ctx, c, []string{key}, "tok", 10000).Err(); err != nil {
							return err
						}
						if err := empty.EvalSha(ctx, c, []string{key}, "tok", 60000).Err(); err != nil {
							return err
						}
					case "keys-1":
						if err := claim.EvalSha(ctx, c, []string{key}, "tok", 10000, 0, 1).Err(); err != nil {
							return err
						}
					default:
						if err := claim.EvalSha(ctx, c, []string{key, key + ":q", key + ":qx"}, "tok", 10000, 0, 1, 100).Err(); err != nil {
							return err
						}
					}
					return c.Unlink(ctx, key).Err()
				})
			})
		}
	}
}
