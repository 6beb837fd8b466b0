package rediskit

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/internal/testenv"
)

// A lock key carries the last fence it issued: a take of a new key
// issues a hold HoldFences fences from the server's clock in µs; a release
// deletes the key once the clock has passed the last of them (any later
// take issues at least the clock), keeps it in a tombstone until then, and
// the next take issues a higher fence. A fence that runs ahead of the
// clock (a tombstone restored from a server whose clock ran ahead) is
// kept: the next take issues it + 1, one fence only, and its release
// leaves a tombstone with that fence for a minute. A value of no form of
// ours counts as held.
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
	release := func(tok string, clock int64) {
		t.Helper()
		if code, err := b.Release(ctx, c, key, tok, false, 0, clock, true, 0); err != nil || code != ReleaseFreed {
			t.Fatalf("release %s: %v %v", tok, code, err)
		}
	}
	r := take("a")
	if r.Code != AcquireTaken || r.N != r.Clock || r.Clock <= 0 || r.Fences != HoldFences {
		t.Fatalf("new key: %+v, want taken with the clock as first fence and %d fences", r, HoldFences)
	}
	last := r.N + HoldFences - 1
	if v := c.Get(ctx, lk).Val(); v != fmt.Sprintf("L1|a|%d|", last) {
		t.Errorf("held value %q, want the hold's last fence %d", v, last)
	}
	release("a", r.Clock) // the clock has not passed the hold's last fence: a tombstone until it has
	p := c.TxPipeline()
	get, ttl := p.Get(ctx, lk), p.PTTL(ctx, lk)
	_, _ = p.Exec(ctx)
	// (On a loaded machine the tombstone may be gone already: it lives
	// until the clock passes its fence, 2 ms at most.)
	if v, pttl := get.Val(), ttl.Val(); (v != fmt.Sprintf("L1|~|%d|", last) || pttl < 0 || pttl > 3*time.Millisecond) && v != "" {
		t.Errorf("released at once: %q for %s, want a tombstone with fence %d for at most 3ms", v, pttl, last)
	}
	time.Sleep(5 * time.Millisecond)
	if n := c.Exists(ctx, lk).Val(); n != 0 {
		t.Errorf("tombstone %q outlived the clock passing its fence", c.Get(ctx, lk).Val())
	}
	r1 := take("a1")
	if r1.Code != AcquireTaken || r1.N <= last {
		t.Errorf("retake: %+v, want a fence above %d", r1, last)
	}
	release("a1", r1.Clock+HoldFences) // the fence is below the clock reading: deleted without reading the clock again
	if n := c.Exists(ctx, lk).Val(); n != 0 {
		t.Errorf("released key left %q, want it deleted (the clock passed its fence)", c.Get(ctx, lk).Val())
	}
	r = r1
	r2 := take("a2")
	if r2.Code != AcquireTaken || r2.N <= r.N+HoldFences-1 {
		t.Errorf("retake: %+v, want a fence above %d", r2, r.N+HoldFences-1)
	}
	time.Sleep(time.Millisecond) // the clock passes the hold's fences
	release("a2", 0)             // no clock reading given: the release reads the clock
	if n := c.Exists(ctx, lk).Val(); n != 0 {
		t.Errorf("released key left %q, want it deleted (the clock passed its fence)", c.Get(ctx, lk).Val())
	}
	ahead := r.Clock + 1_000_000_000
	for _, withClock := range []bool{false, true} {
		c.Set(ctx, lk, fmt.Sprintf("L1|~|%d|", ahead), time.Minute)
		rb := take("b")
		if rb.Code != AcquireTaken || rb.N != ahead+1 || rb.Clock >= rb.N || rb.Fences != 1 {
			t.Errorf("tombstone %d: %+v, want one fence, %d, ahead of the clock", ahead, rb, ahead+1)
		}
		clock := int64(0)
		if withClock {
			clock = rb.Clock // a reading below the fence does not spare the check
		}
		release("b", clock)
		if v := c.Get(ctx, lk).Val(); v != fmt.Sprintf("L1|~|%d|", ahead+1) {
			t.Errorf("released (clock %d) value %q, want a tombstone with fence %d (ahead of the clock)", clock, v, ahead+1)
		}
	}
	if pttl := c.PTTL(ctx, lk).Val(); pttl <= 59*time.Second || pttl > time.Minute {
		t.Errorf("tombstone PTTL %s, want a minute", pttl)
	}
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
				Release.Run(ctx, p, lockNames(b, key), tok, 0, 0, b.Keys.Channel(key), "n", 0, 0)
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
			top = max(top, uint64(r.N)+r.Fences-1)
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
// included. A take reserves fences less than HoldFences µs past the clock,
// and a key's fence moves by one per take beyond that, slower than the
// server's clock in microseconds, so the clock floor it falls back to is
// above it.
func TestFencesOutrunNoClock(t *testing.T) {
	p := testenv.StartRedis(t)
	c := redis.NewClient(&redis.Options{Addr: p.Addr})
	defer c.Close()
	ctx := context.Background()
	b := &Base{}
	b.Init(Options{Prefix: "oncekit:lock:"})
	for _, lose := range []string{"flushall", "expiry"} {
		t.Run(lose, func(t *testing.T) {
			key := "hot-" + lose
			top := takeMany(t, c, b, key, 100_000, lose == "expiry")
			highest := top // the last hold's last local hand-off
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
			if f := uint64(r.N); f <= highest {
				t.Errorf("after 100,000 takes and %s, fence %d is not above %d, issued before", lose, f, highest)
			}
		})
	}
}

// A record carries its fence: a claim of a new key issues the server's
// clock; Complete keeps the fence and the fingerprint; Abandon leaves a
// tombstone with the fence and the attempt for idem.AttemptMemory; a give-
// back of a first attempt deletes the record once the clock has passed its
// fence, and leaves a tombstone with it while the fence is ahead (a Redlock
// floor from a node whose clock runs ahead), which the next claim goes
// past. A claim that is not the caller's is left alone.
func TestRecordFence(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: testenv.RedisAddrs(t, 1)[0]})
	defer c.Close()
	ctx := context.Background()
	b := &Base{}
	b.Init(Options{RecordPrefix: fmt.Sprintf("record-fence-test:%d:", time.Now().UnixNano())})
	name := func(k string) string { return b.Records.Record(idemdriver.MustKey(k)) }
	begin := func(k, tok string) BeginReply {
		t.Helper()
		r, err := b.Begin(ctx, c, idemdriver.MustKey(k), "fp-1", tok, time.Minute, nil)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	finish := func(k, tok string, op FinishOp, result string, floor uint64) bool {
		t.Helper()
		ok, err := b.Finish(ctx, c, idemdriver.MustKey(k), tok, op, time.Hour, []byte(result), floor)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	defer c.Del(ctx, name("a"), name("b"), name("c"))

	r := begin("a", "tok-a")
	if r.Code != BeginClaimed || r.N != r.Clock || r.Clock <= 0 {
		t.Fatalf("new key: %+v, want claimed with the clock as fence", r)
	}
	if finish("a", "tok-other", Complete, "x", 0) {
		t.Error("Complete with another token succeeded")
	}
	if !finish("a", "tok-a", Complete, `{"ok":1}`, 0) {
		t.Fatal("Complete of the caller's claim refused")
	}
	if v, want := c.Get(ctx, name("a")).Val(), fmt.Sprintf(`R2|c|%d|||4|fp-1{"ok":1}`, r.N); v != want {
		t.Errorf("completed record %q, want %q", v, want)
	}
	if finish("a", "tok-a", Complete, "again", 0) {
		t.Error("a second Complete succeeded")
	}

	rb := begin("b", "tok-b")
	if pttl := c.PTTL(ctx, name("b")).Val(); pttl <= time.Minute+idem.AttemptMemory-time.Second || pttl > time.Minute+idem.AttemptMemory {
		t.Errorf("in-flight record's PTTL %s, want the lease + idem.AttemptMemory", pttl)
	}
	if !finish("b", "tok-b", Extend, "", 0) || !finish("b", "tok-b", Abandon, "", 0) {
		t.Fatal("Extend or Abandon of the caller's claim refused")
	}
	if v, want := c.Get(ctx, name("b")).Val(), fmt.Sprintf("R2|x|%d|||0|", rb.N); v != want {
		t.Errorf("abandoned record %q, want the tombstone %q (attempt 1)", v, want)
	}
	if pttl := c.PTTL(ctx, name("b")).Val(); pttl <= idem.AttemptMemory-time.Second {
		t.Errorf("tombstone's PTTL %s, want idem.AttemptMemory", pttl)
	}
	r2 := begin("b", "tok-b2")
	if r2.Code != BeginClaimed || r2.N <= rb.N || r2.Attempt != 2 {
		t.Errorf("claim after Abandon: %+v, want a fence above %d, attempt 2", r2, rb.N)
	}
	// A claim given back is not an attempt: the record keeps the one
	// before it; given back at attempt 1, nothing is kept.
	if !finish("b", "tok-b2", GiveBack, "", 0) {
		t.Fatal("GiveBack refused")
	}
	if r3 := begin("b", "tok-b3"); r3.Code != BeginClaimed || r3.Attempt != 2 {
		t.Errorf("claim after a give-back: %+v, want attempt 2", r3)
	}
	if !finish("b", "tok-b3", Complete, "done", 0) {
		t.Fatal("Complete refused")
	}
	c.Del(ctx, name("b"))
	if r4 := begin("b", "tok-b4"); r4.Code != BeginClaimed || r4.Attempt != 1 || !finish("b", "tok-b4", GiveBack, "", 0) {
		t.Fatalf("claim of a new key and its give-back: %+v", r4)
	}
	if n := c.Exists(ctx, name("b")).Val(); n != 0 {
		t.Errorf("given-back record left %q, want it deleted (the clock passed its fence)", c.Get(ctx, name("b")).Val())
	}

	rc := begin("c", "tok-c")
	ahead := uint64(rc.Clock) + 1_000_000_000
	if !finish("c", "tok-c", GiveBack, "", ahead) {
		t.Fatal("GiveBack with a floor refused")
	}
	if v, want := c.Get(ctx, name("c")).Val(), fmt.Sprintf("R2|x|%d|||0|0", ahead); v != want {
		t.Errorf("given-back record %q, want the tombstone %q", v, want)
	}
	if r3 := begin("c", "tok-c2"); r3.Code != BeginClaimed || uint64(r3.N) != ahead+1 || r3.Attempt != 1 {
		t.Errorf("claim after the tombstone: %+v, want fence %d, attempt 1", r3, ahead+1)
	}
}

// A release while a process waits in the key's queue keeps the queue's
// flag in a tombstone — unfenced too, where the key has no fence to keep —
// so that whoever takes the key next knows to wake the queue when it
// releases. (Deleting the key lost the flag: the next holder's release took
// the fast path, and the queued process slept until its recheck.)
func TestReleaseKeepsWaitersFlag(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: testenv.RedisAddrs(t, 1)[0]})
	defer c.Close()
	ctx := context.Background()
	for _, unfenced := range []bool{false, true} {
		b := &Base{}
		b.Init(Options{Prefix: fmt.Sprintf("flag-test:%d:", time.Now().UnixNano()), Recheck: time.Second, MaxBackoff: 0})
		key := "k"
		lk := b.Keys.Lock(key)
		take := func(tok string, queued bool) AcquireReply {
			t.Helper()
			r, err := b.Acquire(ctx, c, AcquireArgs{Key: key, Token: tok, TTL: time.Minute, Unfenced: unfenced, Queued: queued}, nil)
			if err != nil {
				t.Fatal(err)
			}
			return r
		}
		if r := take("a", false); r.Code != AcquireTaken {
			t.Fatalf("unfenced=%v: take a: %+v", unfenced, r)
		}
		if r := take("b", true); r.Code != AcquireBusy { // b's process joins the queue
			t.Fatalf("unfenced=%v: take b: %+v, want busy", unfenced, r)
		}
		// The key is flagged: the short script leaves it to the full one.
		if code, err := b.Release(ctx, c, key, "a", false, 0, 0, true, 0); err != nil || code != ReleaseFreed {
			t.Fatalf("unfenced=%v: release a: %v %v", unfenced, code, err)
		}
		if v := c.Get(ctx, lk).Val(); !strings.HasPrefix(v, "L1|~|") || !strings.HasSuffix(v, "|w") {
			t.Errorf("unfenced=%v: released key with a queued process holds %q, want a tombstone flagged w", unfenced, v)
		}
		if r := take("b", true); r.Code != AcquireTaken {
			t.Fatalf("unfenced=%v: b's retry: %+v", unfenced, r)
		}
		c.Del(ctx, lk, lk+":q", lk+":qx")
	}
}

// A replay is answered from the completed record, with its result and
// remaining retention; another fingerprint is a mismatch, and an in-flight
// record is reported in flight, whatever the fingerprint lengths.
func TestBeginReplies(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: testenv.RedisAddrs(t, 1)[0]})
	defer c.Close()
	ctx := context.Background()
	b := &Base{}
	b.Init(Options{RecordPrefix: fmt.Sprintf("begin-test:%d:", time.Now().UnixNano())})
	defer c.Del(ctx, b.Records.Record(idemdriver.MustKey("done")), b.Records.Record(idemdriver.MustKey("busy")))
	begin := func(k, fp string) BeginReply {
		t.Helper()
		r, err := b.Begin(ctx, c, idemdriver.MustKey(k), fp, "tok-"+fp, time.Minute, nil)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := begin("done", "fp|1"); r.Code != BeginClaimed {
		t.Fatalf("claim: %+v", r)
	}
	if ok, err := b.Finish(ctx, c, idemdriver.MustKey("done"), "tok-fp|1", Complete, time.Hour, []byte("R2|c|9|||3|abc"), 0); err != nil || !ok {
		t.Fatalf("complete: %v %v", ok, err)
	}
	if r := begin("done", "fp|1"); r.Code != BeginCompleted || string(r.Result) != "R2|c|9|||3|abc" || r.N <= 59*60*1000 {
		t.Errorf("replay: %+v", r)
	}
	for _, fp := range []string{"fp|2", "fp|", "fp|12", ""} {
		if r := begin("done", fp); r.Code != BeginMismatch {
			t.Errorf("replay with fingerprint %q: %+v, want a mismatch", fp, r)
		}
	}
	if r := begin("busy", "fp"); r.Code != BeginClaimed {
		t.Fatalf("claim: %+v", r)
	}
	if r := begin("busy", "fp"); r.Code != BeginInFlight {
		t.Errorf("duplicate of an in-flight claim: %+v", r)
	}
}

// A release given a lower bound on the server's clock (the reading that
// came with the fence, or one moved on since) keeps a fence that is ahead
// of it by less than a tombstone's life in a tombstone that expires once
// the clock has passed the fence, and reads no clock to tell.
func TestReleaseTombstoneExpiresWithFence(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: testenv.StartRedis(t).Addr}) // private: its TIME calls are ours
	defer c.Close()
	ctx := context.Background()
	b := &Base{}
	b.Init(Options{Prefix: "tomb-test:"})
	const key = "k"
	lk := b.Keys.Lock(key)
	timeCalls := func() (n int) {
		info := c.Info(ctx, "commandstats").Val()
		if i := strings.Index(info, "cmdstat_time:calls="); i >= 0 {
			fmt.Sscanf(info[i+len("cmdstat_time:calls="):], "%d", &n)
		}
		return n
	}
	now := c.Time(ctx).Val().UnixMicro()
	ahead := now + 300_000
	c.Set(ctx, lk, fmt.Sprintf("L1|~|%d|", ahead), time.Minute)
	r, err := b.Acquire(ctx, c, AcquireArgs{Key: key, Token: "a", TTL: time.Minute}, nil)
	if err != nil || r.Code != AcquireTaken || r.N != ahead+1 {
		t.Fatalf("take: %+v %v, want fence %d", r, err, ahead+1)
	}
	before := timeCalls()
	if code, err := b.Release(ctx, c, key, "a", false, 0, r.Clock, true, 0); err != nil || code != ReleaseFreed {
		t.Fatalf("release: %v %v", code, err)
	}
	if got := timeCalls() - before; got != 0 {
		t.Errorf("the release read the clock %d times, want none", got)
	}
	if v := c.Get(ctx, lk).Val(); v != fmt.Sprintf("L1|~|%d|", ahead+1) {
		t.Errorf("released value %q, want a tombstone of %d", v, ahead+1)
	}
	want := time.Duration(ahead+1-r.Clock)*time.Microsecond + 2*time.Millisecond
	if pttl := c.PTTL(ctx, lk).Val(); pttl <= want-250*time.Millisecond || pttl > want {
		t.Errorf("tombstone PTTL %s, want about %s (until the clock passes the fence)", pttl, want)
	}
	for c.Exists(ctx, lk).Val() == 1 {
		time.Sleep(10 * time.Millisecond)
	}
	if clock := c.Time(ctx).Val().UnixMicro(); clock <= ahead+1 {
		t.Errorf("the tombstone expired at %d, before the clock passed its fence %d", clock, ahead+1)
	}
	r2, err := b.Acquire(ctx, c, AcquireArgs{Key: key, Token: "b", TTL: time.Minute}, nil)
	if err != nil || r2.Code != AcquireTaken || r2.N <= ahead+1 {
		t.Errorf("take after the tombstone expired: %+v %v, want a fence above %d", r2, err, ahead+1)
	}
}

// A release with no bound on the server's clock reads it, and keeps a
// fence that is ahead of it in a tombstone only until the clock has
// passed the fence, as a release with a bound does (not a whole
// tombstone's life).
func TestReleaseWithoutClockBoundTombstoneExpiresWithFence(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: testenv.RedisAddrs(t, 1)[0]})
	defer c.Close()
	ctx := context.Background()
	b := &Base{}
	b.Init(Options{Prefix: fmt.Sprintf("tomb-noclock-test:%d:", time.Now().UnixNano())})
	const key = "k"
	lk := b.Keys.Lock(key)
	ahead := c.Time(ctx).Val().UnixMicro() + 300_000
	c.Set(ctx, lk, fmt.Sprintf("L1|~|%d|", ahead), time.Minute)
	r, err := b.Acquire(ctx, c, AcquireArgs{Key: key, Token: "a", TTL: time.Minute}, nil)
	if err != nil || r.Code != AcquireTaken || r.N != ahead+1 {
		t.Fatalf("take: %+v %v, want fence %d", r, err, ahead+1)
	}
	if code, err := b.Release(ctx, c, key, "a", false, 0, 0, true, 0); err != nil || code != ReleaseFreed {
		t.Fatalf("release: %v %v", code, err)
	}
	if v := c.Get(ctx, lk).Val(); v != fmt.Sprintf("L1|~|%d|", ahead+1) {
		t.Errorf("released value %q, want a tombstone of %d", v, ahead+1)
	}
	if pttl := c.PTTL(ctx, lk).Val(); pttl <= 0 || pttl > 302*time.Millisecond {
		t.Errorf("tombstone PTTL %s, want at most 302ms (until the clock passes the fence)", pttl)
	}
	for c.Exists(ctx, lk).Val() == 1 {
		time.Sleep(10 * time.Millisecond)
	}
	if clock := c.Time(ctx).Val().UnixMicro(); clock <= ahead+1 {
		t.Errorf("the tombstone expired at %d, before the clock passed its fence %d", clock, ahead+1)
	}
}

// The scripts reserve as many fences per take as the drivers hand out
// (HoldFences): fence.lua's issue, and acquire_fast.lua, which runs
// before fence.lua is defined.
func TestHoldFencesAgree(t *testing.T) {
	if want := fmt.Sprintf("local hold_fences = %d\n", HoldFences); !strings.Contains(fenceLua, want) {
		t.Errorf("fence.lua does not say %q", want)
	}
	if want := fmt.Sprintf("last = first + %d ", HoldFences-1); !strings.Contains(acquireFastLua, want) {
		t.Errorf("acquire_fast.lua does not say %q", want)
	}
}

// Fences fit in 53 bits, so that a script (Lua numbers are doubles), JSON
// or JavaScript compares them exactly: a hold's last fence is a moment
// past the server's clock in µs, about 2^51 today.
func TestFencesBelow2To53(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: testenv.RedisAddrs(t, 1)[0]})
	defer c.Close()
	b := &Base{}
	b.Init(Options{Prefix: fmt.Sprintf("fence53-test:%d:", time.Now().UnixNano())})
	r, err := b.Acquire(t.Context(), c, AcquireArgs{Key: "k", Token: "a", TTL: time.Minute}, nil)
	if err != nil || r.Code != AcquireTaken {
		t.Fatalf("take: %+v %v", r, err)
	}
	defer c.Del(context.Background(), b.Keys.Lock("k"))
	if last := uint64(r.N) + r.Fences - 1; last >= 1<<53 {
		t.Errorf("last fence %d is not below 2^53", last)
	}
}
