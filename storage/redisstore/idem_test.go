package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/idem/idemtest"
	"github.com/oncekit/oncekit/storage/redisstore"

	"github.com/redis/go-redis/v9"
)

func TestIdemConformance(t *testing.T) {
	t.Parallel()
	admin := newClient(t)
	idemtest.Run(t, idemtest.Config{
		NewStore:      func(t *testing.T) idemdriver.Store { return newStore(t, newClient(t)) },
		RunnerProcess: true,
		Corrupt: func(t *testing.T, key string) {
			// Not a record: a plain string under the record's name.
			if err := admin.Set(context.Background(), "oncekit:idem:{"+key+"}", "garbage", time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
		},
		Effect: redisEffect(admin),
	})
}

// countUpTo is an effect: add one to KEYS[1] unless it reached ARGV[1].
var countUpTo = redisstore.NewEffectScript(`
  local n = tonumber(redis.call('GET', KEYS[1]) or '0')
  if n >= tonumber(ARGV[1]) then return 'limit reached' end
  redis.call('INCR', KEYS[1])
  redis.call('PEXPIRE', KEYS[1], 60000)
`)

func redisEffect(admin redis.UniversalClient) func(t *testing.T, key string, limit int) (any, func() int) {
	return func(t *testing.T, key string, limit int) (any, func() int) {
		counter := redisstore.EffectKey(key, "idemtest:effect:")
		return redisstore.Effect{Script: countUpTo, Keys: []string{counter}, Args: []any{limit}}, func() int {
			n, err := admin.Get(context.Background(), counter).Int()
			if err != nil && !errors.Is(err, redis.Nil) {
				t.Fatal(err)
			}
			return n
		}
	}
}

// Begin of a new key and Complete are one round trip each; a replay is one.
func TestIdemRoundTrips(t *testing.T) {
	var rt counter
	s := newStore(t, newClient(t, &rt))
	g, err := idem.NewGuard(s)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	k := idemdriver.ScopedKey("rt", time.Now().Format(time.RFC3339Nano))
	warm := idemdriver.ScopedKey("rt-warm", time.Now().Format(time.RFC3339Nano))
	if _, _, err := g.Do(ctx, warm, "fp", func(context.Context) ([]byte, error) { return []byte("w"), nil }); err != nil {
		t.Fatal(err) // loads the scripts
	}
	for _, tc := range []struct {
		name string
		want int64
	}{{"new key", 2}, {"replay", 1}} {
		before := rt.N.Load()
		if _, _, err := g.Do(ctx, k, "fp", func(context.Context) ([]byte, error) { return []byte("r"), nil }); err != nil {
			t.Fatal(err)
		}
		if n := rt.N.Load() - before; n != tc.want {
			t.Errorf("Do for a %s made %d round trips, want %d", tc.name, n, tc.want)
		}
	}
}

// incrThenFail writes, then fails with an error reply: Redis keeps the
// write (a script is not rolled back).
var incrThenFail = redisstore.NewEffectScript(`
  redis.call('INCR', KEYS[1])
  redis.call('PEXPIRE', KEYS[1], 60000)
  return redis.error_reply('ERR boom')
`)

// incrThenWrongType writes, then runs a command on a key of the wrong
// type: the script fails with WRONGTYPE.
var incrThenWrongType = redisstore.NewEffectScript(`
  redis.call('INCR', KEYS[1])
  redis.call('PEXPIRE', KEYS[1], 60000)
  redis.call('HGET', KEYS[1], 'f')
`)

// An effect whose script answers with an error reply is not run again: the
// reply is the store's answer, not a fault. Do reports it, the claim is
// abandoned, and the effect's write happened once.
func TestEffectErrorReplyNotRetried(t *testing.T) {
	for name, script := range map[string]*redisstore.EffectScript{"error_reply": incrThenFail, "wrongtype": incrThenWrongType} {
		t.Run(name, func(t *testing.T) { testEffectErrorReply(t, script) })
	}
}

func testEffectErrorReply(t *testing.T, script *redisstore.EffectScript) {
	admin := newClient(t)
	s := newStore(t, newClient(t))
	g, err := idem.NewGuard(s, idem.WithTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	k := idemdriver.ScopedKey("effect-error", time.Now().Format(time.RFC3339Nano))
	counter := redisstore.EffectKey(k, "effect-error:")
	_, _, err = g.Do(ctx, k, "fp", func(ctx context.Context) ([]byte, error) {
		return []byte("ok"), idem.Commit(ctx, redisstore.Effect{Script: script, Keys: []string{counter}})
	})
	if !errors.Is(err, idem.ErrEffectFailed) {
		t.Fatalf("Do with an effect that fails: %v, want ErrEffectFailed", err)
	}
	if n, err := admin.Get(ctx, counter).Int(); err != nil || n != 1 {
		t.Errorf("the effect ran %d times (%v), want once", n, err)
	}
	c, err := s.Begin(ctx, idemdriver.MustKey(k), "fp", time.Second)
	if err != nil || c.State != idemdriver.Acquired {
		t.Fatalf("after a failed effect the key is %v (%v), want it free (abandoned)", c.State, err)
	}
	_ = s.Abandon(ctx, c)
}

// cmdCounts counts a client's commands by name, sent alone or pipelined.
type cmdCounts struct {
	mu sync.Mutex
	n  map[string]int
}

func (h *cmdCounts) count(cmds ...redis.Cmder) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n == nil {
		h.n = map[string]int{}
	}
	for _, c := range cmds {
		h.n[c.Name()]++
	}
}

func (h *cmdCounts) get(name string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n[name]
}

func (h *cmdCounts) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *cmdCounts) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.count(cmd); return next(ctx, cmd) }
}
func (h *cmdCounts) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { h.count(cmds...); return next(ctx, cmds) }
}

// Once most Begins of a Store find their key completed (a burst of
// retries), a replay is answered by one plain GET, without the script;
// whatever the GET does not settle — another fingerprint, a claim in
// flight, a new key — still goes to the script and is answered as before.
func TestReplaysAnsweredByOneGet(t *testing.T) {
	counts := &cmdCounts{}
	st := newStore(t, newClient(t, counts))
	ctx := ctxT(t, 10*time.Second)
	k := idemdriver.ScopedKey("t", fmt.Sprintf("replayed-%d", time.Now().UnixNano()))
	c, err := st.Begin(ctx, idemdriver.MustKey(k), "fp", time.Minute)
	if err != nil || c.State != idemdriver.Acquired {
		t.Fatalf("Begin: %v %v", c.State, err)
	}
	if err := st.Complete(ctx, c, []byte("result"), time.Minute); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		r, err := st.Begin(ctx, idemdriver.MustKey(k), "fp", time.Minute)
		if err != nil || r.State != idemdriver.Completed || string(r.Result) != "result" {
			t.Fatalf("replay %d: %v %q %v", i, r.State, r.Result, err)
		}
	}
	if gets := counts.get("get"); gets < 8 {
		t.Errorf("%d GETs for 10 replays, want the replays after the first answered by GET", gets)
	}
	if r, err := st.Begin(ctx, idemdriver.MustKey(k), "other", time.Minute); err != nil || r.State != idemdriver.Mismatch {
		t.Errorf("another fingerprint after the replays: %v %v, want mismatch", r.State, err)
	}
	inFlight := k + "-in-flight"
	if c, err := newStore(t, newClient(t)).Begin(ctx, idemdriver.MustKey(inFlight), "fp", time.Minute); err != nil || c.State != idemdriver.Acquired {
		t.Fatalf("Begin: %v %v", c.State, err)
	}
	if r, err := st.Begin(ctx, idemdriver.MustKey(inFlight), "fp", time.Minute); err != nil || r.State != idemdriver.InFlight {
		t.Errorf("a key in flight after the replays: %v %v, want in flight", r.State, err)
	}
	if r, err := st.Begin(ctx, idemdriver.MustKey(k+"-new"), "fp", time.Minute); err != nil || r.State != idemdriver.Acquired || r.Attempt != 1 {
		t.Errorf("a new key after the replays: %v attempt %d %v, want acquired, attempt 1", r.State, r.Attempt, err)
	}
}

// ListKeys lists what InspectRecord reports: an abandoned claim's
// tombstone and an in-flight claim past its lease, both kept a day only to
// count the next claim's attempt, are not listed (oncectl record list
// asked each of them, a round trip per key, and found nothing).
func TestListKeysSkipsAttemptMemory(t *testing.T) {
	s := newStore(t, newClient(t), redisstore.WithRecordPrefix(fmt.Sprintf("list-attempts:%d:", time.Now().UnixNano())))
	ctx := t.Context()
	begin := func(key string, lease time.Duration) idemdriver.Claim {
		t.Helper()
		c, err := s.Begin(ctx, idemdriver.MustKey(key), "fp", lease)
		if err != nil || c.State != idemdriver.Acquired {
			t.Fatalf("Begin %s: %v %v", key, c.State, err)
		}
		return c
	}
	if err := s.Abandon(ctx, begin("abandoned", time.Minute)); err != nil {
		t.Fatal(err)
	}
	begin("in-flight", time.Minute)
	if err := s.Complete(ctx, begin("completed", time.Minute), []byte("ok"), time.Minute); err != nil {
		t.Fatal(err)
	}
	begin("lease-over", 20*time.Millisecond)
	time.Sleep(50 * time.Millisecond)
	var listed []string
	if err := s.ListKeys(ctx, func(k string) bool { listed = append(listed, k); return true }); err != nil {
		t.Fatal(err)
	}
	slices.Sort(listed)
	if want := []string{"completed", "in-flight"}; !slices.Equal(listed, want) {
		t.Errorf("ListKeys listed %q, want %q", listed, want)
	}
	for _, k := range []string{"abandoned", "lease-over"} {
		if info, err := s.InspectRecord(ctx, k); err != nil || info.Found {
			t.Errorf("InspectRecord(%s) = %+v, %v; want none", k, info, err)
		}
	}
}
