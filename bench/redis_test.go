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
