package rediskit

import (
	"context"
	_ "embed"
	"errors"

	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/core/lock/lockdriver"
	"github.com/oncekit/oncekit/storage/internal/bg"
)

var (
	//go:embed lua/acquire.lua
	acquireLua string
	//go:embed lua/release.lua
	releaseLua string
	//go:embed lua/refresh.lua
	refreshLua string
	//go:embed lua/transfer.lua
	transferLua string
	//go:embed lua/acquire_all.lua
	acquireAllLua string
	//go:embed lua/idem_begin.lua
	idemBeginLua string
	//go:embed lua/idem_finish.lua
	idemFinishLua string
	//go:embed lua/prelude.lua
	preludeLua string
	//go:embed lua/leave_queue.lua
	leaveQueueLua string
	//go:embed lua/record_state.lua
	recordStateLua string
	//go:embed lua/fence.lua
	fenceLua string
	//go:embed lua/idem_commit.lua
	idemCommitLua string
	//go:embed lua/claim.lua
	claimLua string
	//go:embed lua/head.lua
	headLua string
	//go:embed lua/acquire_fast.lua
	acquireFastLua string
	//go:embed lua/release_fast.lua
	releaseFastLua string
	//go:embed lua/idem_finish_fast.lua
	idemFinishFastLua string
	//go:embed lua/idem_begin_fast.lua
	idemBeginFastLua string
	//go:embed lua/acquire_new.lua
	acquireNewLua string
	//go:embed lua/release_new.lua
	releaseNewLua string
	//go:embed lua/stock.lua
	stockLua string
)

// The scripts; their KEYS and ARGV are documented at the top of each file.
// The scripts on the path of every request start with a fast path
// (lua/*_fast.lua) that decides the common case with the fewest calls and
// no set-up; the others start with lua/head.lua. Every one that reads a
// lock key or a record then has lua/fence.lua (the values' forms and the
// fences), those that announce on pub/sub lua/prelude.lua, those that read
// a record lua/claim.lua. AcquireNew and ReleaseNew are Acquire for a
// first attempt and Release for a key without flags, sent with fewer keys
// and arguments (one key and four, one and three): the path of every new key
// needs no more. When they cannot decide, the caller runs the full script.
var (
	AcquireNew   = redis.NewScript(acquireFastLua + fenceLua + acquireNewLua)
	ReleaseNew   = redis.NewScript(releaseFastLua + releaseNewLua)
	Acquire      = redis.NewScript(acquireFastLua + fenceLua + acquireLua)
	Release      = redis.NewScript(releaseFastLua + preludeLua + fenceLua + releaseLua)
	Refresh      = redis.NewScript(headLua + fenceLua + refreshLua)
	Transfer     = redis.NewScript(headLua + fenceLua + transferLua)
	AcquireAll   = redis.NewScript(headLua + fenceLua + acquireAllLua)
	IdemBegin    = redis.NewScript(idemBeginFastLua + fenceLua + claimLua + idemBeginLua)
	IdemFinish   = redis.NewScript(idemFinishFastLua + preludeLua + fenceLua + claimLua + idemFinishLua)
	LeaveQueue   = redis.NewScript(leaveQueueLua)
	RecordStatus = redis.NewScript(headLua + fenceLua + claimLua + recordStateLua)
	Stock        = redis.NewScript(stockLua)
)

// EffectScript is an effect's Lua joined with the completion of a claim
// (lua/idem_commit.lua) into one script, made once per effect.
type EffectScript struct{ script *redis.Script }

// NewEffectScript wraps lua, the body of a function effect(KEYS, ARGV)
// that returns nil to go ahead or a reason to refuse.
func NewEffectScript(lua string) *EffectScript {
	return &EffectScript{redis.NewScript(headLua + preludeLua + fenceLua + claimLua + "local function effect(KEYS, ARGV)\n" + lua + "\nend\n" + idemCommitLua)}
}

// Run runs script and returns its reply, or an error matching ctx.Err() as
// soon as ctx ends, whatever the client's own timeouts (go-redis only
// honours a context's deadline on the socket with ContextTimeoutEnabled).
// When it returns early, the request goes on in the background, tracked by
// wg, and late — if not nil — receives its reply, to undo what it did.
//
// The request runs on the caller's goroutine when ctx never ends, and when
// only its deadline can end it (lockdriver.DeadlineOnly: the clean-up and
// completion contexts, and a claim under idemdriver.ClaimOutlivesCaller) and the
// client enforces deadlines itself
// (ContextTimeoutEnabled). Otherwise it runs on a background goroutine:
// the hop costs tens of microseconds on a busy machine, the price of
// returning at once when a caller's context is cancelled mid-request.
func Run(ctx context.Context, wg *bg.Group, c redis.Scripter, script *redis.Script,
	keys []string, late func(*redis.Cmd), args ...any) *redis.Cmd {
	enforces := EnforcesDeadlines(c)
	if onCaller(ctx, enforces) { // (without the closure below: the path of every request)
		return deadlineErr(ctx, script.Run(ctx, c, keys, args...))
	}
	return runCmd(ctx, wg, enforces, redis.NewCmd,
		func(ctx context.Context) *redis.Cmd { return script.Run(ctx, c, keys, args...) }, late)
}

// onCaller reports whether a request under ctx runs on the caller's
// goroutine: ctx never ends, or only its deadline can end it and the
// client stops at the deadline itself (enforces). late is not needed
// then: the caller itself waits for the reply, until ctx's deadline
// (seconds away for the contexts that get here) or the client's own
// timeout.
func onCaller(ctx context.Context, enforces bool) bool {
	return (enforces && lockdriver.DeadlineOnly(ctx)) || ctx.Done() == nil
}

// deadlineErr joins ctx's error to cmd's when the client's timeout was
// ctx's deadline.
func deadlineErr[T redis.Cmder](ctx context.Context, cmd T) T {
	if err := cmd.Err(); err != nil && !IsReply(err) && ctx.Err() != nil {
		cmd.SetErr(errors.Join(ctx.Err(), err))
	}
	return cmd
}

// runCmd is Run for any command: do sends it, with the context it is given.
func runCmd[T redis.Cmder](ctx context.Context, wg *bg.Group, enforces bool, newCmd func(context.Context, ...any) T,
	do func(context.Context) T, late func(T)) T {
	if onCaller(ctx, enforces) {
		return deadlineErr(ctx, do(ctx))
	}
	if err := ctx.Err(); err != nil {
		cmd := newCmd(ctx)
		cmd.SetErr(err)
		return cmd
	}
	reply := make(chan T, 1)
	wg.Go(func() {
		reply <- do(context.WithoutCancel(ctx))
	})
	select {
	case cmd := <-reply:
		return cmd
	case <-ctx.Done():
		if late != nil {
			wg.Go(func() { late(<-reply) })
		}
		cmd := newCmd(ctx)
		cmd.SetErr(ctx.Err())
		return cmd
	}
}

// EnforcesDeadlines reports whether c (or the client an AutoPipeline wraps)
// cuts a request short at its context's deadline by itself: a go-redis
// client with ContextTimeoutEnabled.
func EnforcesDeadlines(c redis.Scripter) bool {
	switch c := c.(type) {
	case *autoPipeline:
		return EnforcesDeadlines(c.Pipeliner)
	case interface{ Options() *redis.Options }:
		return c.Options().ContextTimeoutEnabled
	case interface{ Options() *redis.ClusterOptions }:
		return c.Options().ContextTimeoutEnabled
	}
	return false
}

// IsReply reports whether err is an error reply from the server (redis.Nil
// included): the request arrived and was answered, so there is nothing to
// undo — not a failure to get an answer.
func IsReply(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
}
