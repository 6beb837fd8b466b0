package rediskit

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/internal/testenv"
)

// A first attempt (no owner, outside the queue) runs the short acquire
// script, and a release of a plainly taken key the short release script;
// each answers as the full script would, and leaves to it the cases only
// it can decide — the full script's answer is the one returned. Plain
// marks only a take the short script made.
func TestShortScriptsAnswerAsTheFullOnes(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: testenv.RedisAddrs(t, 1)[0]})
	defer c.Close()
	ctx := context.Background()
	b := &Base{}
	b.Init(Options{Prefix: fmt.Sprintf("short-test:%d:", time.Now().UnixNano()), MaxBackoff: 100 * time.Millisecond})
	take := func(key, tok string, a AcquireArgs) AcquireReply {
		t.Helper()
		a.Key, a.Token = key, tok
		if a.TTL == 0 {
			a.TTL = time.Minute
		}
		r, err := b.Acquire(ctx, c, a, nil)
		if err != nil {
			t.Fatalf("take %s %s: %v", key, tok, err)
		}
		return r
	}
	release := func(key, tok string, clock int64) ReleaseCode {
		t.Helper()
		code, err := b.Release(ctx, c, key, tok, false, 0, clock, true, 0)
		if err != nil {
			t.Fatalf("release %s %s: %v", key, tok, err)
		}
		return code
	}
	now := func() int64 {
		tm, err := c.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		return tm.UnixMicro()
	}

	t.Run("new key", func(t *testing.T) {
		r := take("new", "a", AcquireArgs{})
		if r.Code != AcquireTaken || !r.Plain || r.N <= 0 || r.N != r.Clock {
			t.Fatalf("%+v, want a plain take with the clock as fence", r)
		}
		if code := release("new", "b", 0); code != ReleaseNotOurs {
			t.Errorf("another token's release: %v, want not ours", code)
		}
		if code := release("new", "a", r.Clock+HoldFences); code != ReleaseFreed { // the clock passed the hold's fences
			t.Errorf("release: %v, want freed", code)
		}
		if n := c.Exists(ctx, b.Keys.Lock("new")).Val(); n != 0 {
			t.Errorf("a released key behind the clock is still there")
		}
		if code := release("new", "a", 0); code != ReleaseNotOurs {
			t.Errorf("a second release: %v, want not ours", code)
		}
	})
	// A release that says which fences its token handed out keeps only
	// those: none above the clock leaves no tombstone, some above it leave
	// one that keeps the highest issued (not the take's whole reservation),
	// and the next take's fence is above every fence issued either way.
	t.Run("issued fences", func(t *testing.T) {
		releaseIssued := func(key string, clock int64, issued uint64) {
			t.Helper()
			if code, err := b.Release(ctx, c, key, "a", false, 0, clock, true, issued); err != nil || code != ReleaseFreed {
				t.Fatalf("release %s: %v %v", key, code, err)
			}
		}
		r := take("issued-one", "a", AcquireArgs{})
		releaseIssued("issued-one", r.Clock, uint64(r.N))
		if n := c.Exists(ctx, b.Keys.Lock("issued-one")).Val(); n != 0 {
			t.Errorf("a plain hold that issued only its first fence (the clock) left %q", c.Get(ctx, b.Keys.Lock("issued-one")).Val())
		}
		if again := take("issued-one", "a", AcquireArgs{}); again.N <= r.N {
			t.Errorf("the next take's fence %d is not above the issued %d", again.N, r.N)
		}
		r = take("issued-more", "a", AcquireArgs{})
		issued := uint64(r.N) + 5
		releaseIssued("issued-more", r.Clock, issued)
		if v := c.Get(ctx, b.Keys.Lock("issued-more")).Val(); v != "" && v != fmt.Sprintf("L1|~|%d|", issued) {
			t.Errorf("a hold that issued up to %d left %q, want a tombstone of %d (or none once the clock passed it)", issued, v, issued)
		}
		if again := take("issued-more", "a", AcquireArgs{}); uint64(again.N) <= issued {
			t.Errorf("the next take's fence %d is not above the issued %d", again.N, issued)
		}
	})
	t.Run("held", func(t *testing.T) {
		first := take("held", "a", AcquireArgs{})
		r := take("held", "b", AcquireArgs{})
		last := first.N + int64(first.Fences) - 1
		if r.Code != AcquireBusy || r.Plain || r.Crowded || r.Floor != uint64(last) || r.N <= 0 {
			t.Fatalf("%+v, want busy with the holder's last fence %d as floor, nobody queued", r, last)
		}
		// Held with processes queued: the reply says so.
		c.Set(ctx, b.Keys.Lock("crowded"), "L1|x|5|w", time.Minute)
		if r := take("crowded", "b", AcquireArgs{}); r.Code != AcquireBusy || !r.Crowded || r.Floor != 5 {
			t.Fatalf("a held key with processes queued: %+v, want busy and crowded", r)
		}
		// The holder asks again with its own token (Redlock re-asking a
		// node): the full script renews it.
		if r := take("held", "a", AcquireArgs{}); r.Code != AcquireTaken || r.Plain || r.N != last || r.Fences != 1 {
			t.Fatalf("the holder's own token: %+v, want taken (renewed) by the full script, its last fence %d", r, last)
		}
	})
	t.Run("tombstone ahead of the clock", func(t *testing.T) {
		ahead := now() + int64(time.Hour/time.Microsecond)
		c.Set(ctx, b.Keys.Lock("tomb"), fmt.Sprintf("L1|~|%d|", ahead), time.Minute)
		r := take("tomb", "a", AcquireArgs{})
		if r.Code != AcquireTaken || !r.Plain || r.N != ahead+1 {
			t.Fatalf("%+v, want a plain take with fence %d", r, ahead+1)
		}
		if code := release("tomb", "a", r.Clock); code != ReleaseFreed {
			t.Fatalf("release: %v", code)
		}
		if v := c.Get(ctx, b.Keys.Lock("tomb")).Val(); v != fmt.Sprintf("L1|~|%d|", ahead+1) {
			t.Errorf("released key ahead of the clock holds %q, want its tombstone", v)
		}
	})
	t.Run("tombstone with queued processes", func(t *testing.T) {
		// A process is queued and was just woken: the key is reserved for
		// it.
		lk := b.Keys.Lock("queued")
		c.Set(ctx, lk, "L1|~|5|w", time.Minute)
		c.ZAdd(ctx, b.Keys.Queue("queued"), redis.Z{Score: 1, Member: "other"})
		c.HSet(ctx, b.Keys.QueueExpiry("queued"), "other", now()/1000+b.wakeGrace()/2)
		r := take("queued", "a", AcquireArgs{})
		if r.Code != AcquireBusy || r.Plain || r.Floor != 5 {
			t.Fatalf("%+v, want busy: reserved for the woken process", r)
		}
		// Its place ran out: the key is free, and keeps the flag while the
		// queue has members.
		c.HSet(ctx, b.Keys.QueueExpiry("queued"), "other", now()/1000-1)
		r = take("queued", "a", AcquireArgs{})
		if r.Code != AcquireTaken || r.Plain || r.N <= 5 {
			t.Fatalf("%+v, want taken, not plain (flagged)", r)
		}
		if v := c.Get(ctx, lk).Val(); v != fmt.Sprintf("L1|a|%d|w", r.N+int64(r.Fences)-1) {
			t.Errorf("taken key holds %q, want it flagged", v)
		}
		// Released by the short script, which leaves a flagged key to the
		// full one.
		if code := release("queued", "a", r.Clock); code != ReleaseFreed {
			t.Fatalf("release: %v", code)
		}
		c.Del(ctx, b.Keys.Queue("queued"), b.Keys.QueueExpiry("queued"))
		r = take("queued", "b", AcquireArgs{})
		if r.Code != AcquireTaken || !r.Plain {
			t.Fatalf("%+v, want a plain take once nobody is queued", r)
		}
	})
	t.Run("unfenced", func(t *testing.T) {
		r := take("unfenced", "a", AcquireArgs{Unfenced: true})
		if r.Code != AcquireTaken || !r.Plain || r.N != 0 || r.Clock != 0 {
			t.Fatalf("%+v, want a plain take with fence 0", r)
		}
		if code := release("unfenced", "a", 0); code != ReleaseFreed {
			t.Fatalf("release: %v", code)
		}
	})
	t.Run("too late", func(t *testing.T) {
		// A deadline is sent once the server's clock has been measured.
		for b.ServerDeadline(c, time.Now()) == 0 {
			time.Sleep(10 * time.Millisecond)
		}
		r := take("late", "a", AcquireArgs{Deadline: time.Now().Add(-time.Minute)})
		if r.Code != AcquireLate {
			t.Fatalf("%+v, want late", r)
		}
		if n := c.Exists(ctx, b.Keys.Lock("late")).Val(); n != 0 {
			t.Errorf("a late attempt took the key")
		}
	})
}

// The scripts write idem.AttemptMemory out in milliseconds.
func TestScriptsKnowAttemptMemory(t *testing.T) {
	ms := strconv.FormatInt(idem.AttemptMemory.Milliseconds(), 10)
	for name, src := range map[string]string{"claim.lua": claimLua, "idem_begin_fast.lua": idemBeginFastLua, "idem_finish_fast.lua": idemFinishFastLua} {
		if !strings.Contains(src, ms) {
			t.Errorf("%s does not have idem.AttemptMemory (%s ms)", name, ms)
		}
	}
}

// A replay's GET settles only a completed record of the caller's
// fingerprint; every other value is left to the begin script.
func TestCompletedResult(t *testing.T) {
	for _, c := range []struct {
		v, fp, res string
		ok         bool
	}{
		{"R2|c|1795915537375806|||2|fp{}", "fp", "{}", true},
		{"R2|c|17|w||2|fp", "fp", "", true},
		{"R2|c|17|||2|fpresult|with|bars", "fp", "result|with|bars", true},
		{"R2|c|17|||2|fpx", "fq", "", false},   // another fingerprint
		{"R2|c|17|||3|fpx", "fp", "", false},   // another length
		{"R2|i|17||tok|2|fp", "fp", "", false}, // in flight
		{"R2|x|17|||0|", "", "", false},        // a tombstone
		{"R2|c|1a|||2|fp", "fp", "", false},    // not a fence
		{"R2|c|17||tok|2|fp", "fp", "", false}, // a token
		{"R2|c|17|||9|fp", "fp", "", false},    // truncated
		{"garbage", "fp", "", false},
	} {
		res, ok := completedResult([]byte(c.v), c.fp)
		if ok != c.ok || string(res) != c.res {
			t.Errorf("completedResult(%q, %q) = %q, %v; want %q, %v", c.v, c.fp, res, ok, c.res, c.ok)
		}
	}
}
