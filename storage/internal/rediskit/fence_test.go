package rediskit

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/internal/testenv"
)

// A lock key carries its last fence: a take of a new key issues the
// server's clock in µs, a release leaves a tombstone with the fence for a
// minute, and the next take issues the tombstone's fence + 1 — also when
// the tombstone runs ahead of the clock (restored from a server whose
// clock ran ahead). A value of no form of ours counts as held.
func TestLockKeyFence(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: testenv.RedisAddrs(t, 1)[0]})
	defer c.Close()
	ctx := context.Background()
	b := &Base{}
	b.Init(Options{Prefix: fmt.Sprintf("fence-test:%d:", time.Now().UnixNano())})
	key := "k"
	lk := b.Keys.Lock(key)
	defer c.Del(ctx, lk)
	take := func(tok string) AcquireReply {
		t.Helper()
		r, err := b.Acquire(ctx, c, AcquireArgs{Key: key, Token: tok, TTL: time.Minute}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	release := func(tok string) {
		t.Helper()
		if code, err := b.Release(ctx, c, key, tok, false, 0); err != nil || code != ReleaseFreed {
			t.Fatalf("release %s: %v %v", tok, code, err)
		}
	}
	r := take("a")
	if r.Code != AcquireTaken || r.N != r.Clock || r.Clock <= 0 {
		t.Fatalf("new key: %+v, want taken with the clock as fence", r)
	}
	if v := c.Get(ctx, lk).Val(); v != fmt.Sprintf("a|%d|", r.N) {
		t.Errorf("held value %q", v)
	}
	release("a")
	v := c.Get(ctx, lk).Val()
	if v != fmt.Sprintf("~|%d|", r.N) {
		t.Errorf("released value %q, want a tombstone with fence %d", v, r.N)
	}
	if pttl := c.PTTL(ctx, lk).Val(); pttl <= 59*time.Second || pttl > time.Minute {
		t.Errorf("tombstone PTTL %s, want a minute", pttl)
	}
	ahead := r.Clock + 1_000_000_000
	c.Set(ctx, lk, fmt.Sprintf("~|%d|", ahead), time.Minute)
	if r2 := take("b"); r2.Code != AcquireTaken || r2.N != ahead+1 {
		t.Errorf("tombstone %d: %+v, want fence %d", ahead, r2, ahead+1)
	}
	release("b")
	c.Set(ctx, lk, "not ours", time.Minute)
	if r3 := take("c"); r3.Code != AcquireBusy {
		t.Errorf("a foreign value: %+v, want busy", r3)
	}
}

// takeMany takes key n times, pipelined (an acquisition and its release
// each), and returns the highest fence issued. With keep, the last take is
// not released.
func takeMany(t *testing.T, c *redis.Client, b *Base, key string, n int, keep bool) uint64 {
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
			cmds = append(cmds, Acquire.Run(ctx, p, lockNames(b, key), tok, 60_000, 0, 1, "", "", 0, 0, 0, 0))
			if !keep || done+i < n-1 {
				Release.Run(ctx, p, lockNames(b, key), tok, b.Keys.Channel(key), "n", 0, 0, 0)
			}
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

func lockNames(b *Base, key string) []string {
	return []string{b.Keys.Lock(key), b.Keys.Owner(key), b.Keys.Queue(key), b.Keys.QueueExpiry(key)}
}

// Fences never go backwards, whatever the rate of takes: 100,000 takes of
// one key as fast as one server runs them, then the key's last fence is
// lost — the server loses its data (FLUSHALL, as an empty restart or a
// lossy failover does), or the last holder's key expires: the next lease's
// fence is above every lease fence of every hold before, hand-offs
// included. A key's fence moves by one per take, slower than the server's
// clock in microseconds, so the clock floor it falls back to is above it.
func TestFencesOutrunNoClock(t *testing.T) {
	p := testenv.StartRedis(t)
	c := redis.NewClient(&redis.Options{Addr: p.Addr})
	defer c.Close()
	ctx := context.Background()
	b := &Base{HoldFences: 128}
	b.Init(Options{Prefix: "oncekit:lock:"})
	for _, lose := range []string{"flushall", "expiry"} {
		t.Run(lose, func(t *testing.T) {
			key := "hot-" + lose
			top := takeMany(t, c, b, key, 100_000, lose == "expiry")
			highest := b.LeaseFence(top, b.LeasesPerHold()-1) // its last local hand-off
			switch lose {
			case "flushall":
				if err := c.FlushAll(ctx).Err(); err != nil {
					t.Fatal(err)
				}
			case "expiry":
				if err := c.PExpire(ctx, b.Keys.Lock(key), time.Millisecond).Err(); err != nil {
					t.Fatal(err)
				}
				time.Sleep(5 * time.Millisecond)
			}
			r, err := ParseAcquire(Acquire.Run(ctx, c, lockNames(b, key), "after", 60_000, 0, 1, "", "", 0, 0, 0, 0))
			if err != nil || r.Code != AcquireTaken {
				t.Fatalf("take after %s: %+v %v", lose, r, err)
			}
			if f := b.LeaseFence(uint64(r.N), 0); f <= highest {
				t.Errorf("after 100,000 takes and %s, fence %d is not above %d, issued before", lose, f, highest)
			}
		})
	}
}
