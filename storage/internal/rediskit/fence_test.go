package rediskit

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/internal/testenv"
)

// next_fence issues max(counter + reserved + 1, the server's clock in µs)
// and stores it with its reservation.
func TestNextFence(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: testenv.RedisAddrs(t, 1)[0]})
	defer c.Close()
	ctx := context.Background()
	body := `local f = next_fence(KEYS[1], ARGV[1], ARGV[2])
return {string.format('%d', f), string.format('%d', clock_us()), redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1])}`
	script := redis.NewScript(fenceLua + body)
	key := fmt.Sprintf("fence-test:%d", time.Now().UnixNano())
	defer c.Del(ctx, key)
	// next runs next_fence with a reservation and returns the fence,
	// the server's clock, and the counter stored.
	next := func(reserve int) (fence, clock uint64, stored string) {
		t.Helper()
		v, err := script.Run(ctx, c, []string{key}, 1000, reserve).Slice()
		if err != nil {
			t.Fatal(err)
		}
		fence, _ = strconv.ParseUint(v[0].(string), 10, 64)
		clock, _ = strconv.ParseUint(v[1].(string), 10, 64)
		if pttl := v[3].(int64); pttl <= 59_000 || pttl > 60_000 {
			t.Errorf("counter PTTL %d ms, want the 60 s floor", pttl)
		}
		return fence, clock, v[2].(string)
	}
	set := func(v string) {
		t.Helper()
		if err := c.Set(ctx, key, v, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}

	f, clock, stored := next(0)
	if f != clock || stored != strconv.FormatUint(f, 10) {
		t.Errorf("no counter: fence %d, counter %q; want the clock %d, stored plain", f, stored, clock)
	}
	f2, _, stored := next(128)
	if f2 <= f || stored != fmt.Sprintf("%d:128", f2) {
		t.Errorf("after %d: fence %d, counter %q; want higher, stored with its reservation", f, f2, stored)
	}
	// Ahead of the clock: a counter restored from a server whose
	// clock ran ahead, or reservations issued faster than 1 per µs.
	ahead := clock + 1_000_000_000
	set(fmt.Sprintf("%d:128", ahead))
	if f, _, stored := next(0); f != ahead+129 || stored != strconv.FormatUint(ahead+129, 10) {
		t.Errorf("counter %d:128: fence %d, counter %q; want %d", ahead, f, stored, ahead+129)
	}
	set(strconv.FormatUint(ahead, 10))
	if f, _, stored := next(16); f != ahead+1 || stored != fmt.Sprintf("%d:16", ahead+1) {
		t.Errorf("counter %d: fence %d, counter %q; want %d:16", ahead, f, stored, ahead+1)
	}
	set("not a number")
	if f, clock, _ := next(0); f != clock {
		t.Errorf("unreadable counter: fence %d, want the clock %d", f, clock)
	}
}

// takeMany takes key n times, pipelined (an acquisition and its release
// each), reserving reserve fences past each as processes of earlier
// versions did, and returns the highest counter value issued.
func takeMany(t *testing.T, c *redis.Client, b *Base, key string, n, reserve int) uint64 {
	t.Helper()
	ctx := context.Background()
	for _, s := range []*redis.Script{Acquire, Release} {
		if err := s.Load(ctx, c).Err(); err != nil { // a pipeline does not fall back to EVAL
			t.Fatal(err)
		}
	}
	var top uint64
	const batch = 1000
	for done := 0; done < n; done += batch {
		p := c.Pipeline()
		cmds := make([]*redis.Cmd, 0, batch)
		for i := range batch {
			tok := fmt.Sprintf("t%d", done+i)
			cmds = append(cmds, Acquire.Run(ctx, p, []string{b.Keys.Lock(key), b.Keys.Fence(key), b.Keys.Owner(key)},
				tok, 60_000, 0, 1, "", "", 0, 0, 0, 0, reserve))
			Release.Run(ctx, p, []string{b.Keys.Lock(key), b.Keys.Owner(key)}, tok, b.Keys.Channel(key), "n")
		}
		if _, err := p.Exec(ctx); err != nil {
			t.Fatal(err)
		}
		for _, cmd := range cmds {
			r, err := ParseAcquire(cmd)
			if err != nil || r.Code != AcquireTaken {
				t.Fatalf("take: %+v %v", r, err)
			}
			top = max(top, uint64(r.N))
		}
	}
	return top
}

// Fences never go backwards, whatever the rate of takes: 100,000 takes of
// one key as fast as one server runs them, then the server loses its data
// (FLUSHALL, as an empty restart or a lossy failover does, or the
// counter's own expiry): the next lease's fence is above every lease fence
// of every hold before, hand-offs included. The counter moves by one per
// take, slower than the server's clock in microseconds, so the clock floor
// it falls back to is above it.
func TestFencesOutrunNoClock(t *testing.T) {
	p := testenv.StartRedis(t)
	c := redis.NewClient(&redis.Options{Addr: p.Addr})
	defer c.Close()
	ctx := context.Background()
	b := &Base{HoldFences: 128}
	b.Init(Options{Prefix: "oncekit:lock:"})
	key := "hot"
	top := takeMany(t, c, b, key, 100_000, 0)
	highest := b.LeaseFence(top, b.LeasesPerHold()-1) // its last local hand-off
	if err := c.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	r, err := ParseAcquire(Acquire.Run(ctx, c, []string{b.Keys.Lock(key), b.Keys.Fence(key), b.Keys.Owner(key)},
		"after", 60_000, 0, 1, "", "", 0, 0, 0, 0, 0))
	if err != nil || r.Code != AcquireTaken {
		t.Fatalf("take after FLUSHALL: %+v %v", r, err)
	}
	if f := b.LeaseFence(uint64(r.N), 0); f <= highest {
		t.Errorf("after 100,000 takes and a lost counter, fence %d is not above %d, issued before", f, highest)
	}
}
