package redislua

import (
	"context"
	_ "embed"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/internal/bg"
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
	//go:embed lua/writeback.lua
	writeBackLua string
	//go:embed lua/acquire_all.lua
	acquireAllLua string
	//go:embed lua/idem_begin.lua
	idemBeginLua string
	//go:embed lua/idem_finish.lua
	idemFinishLua string
	//go:embed lua/prelude.lua
	preludeLua string
)

// The scripts; their KEYS and ARGV are documented at the top of each file.
// Those that announce on pub/sub start with lua/prelude.lua.
var (
	Acquire    = redis.NewScript(acquireLua)
	Release    = redis.NewScript(preludeLua + releaseLua)
	Refresh    = redis.NewScript(refreshLua)
	Transfer   = redis.NewScript(transferLua)
	WriteBack  = redis.NewScript(writeBackLua)
	AcquireAll = redis.NewScript(acquireAllLua)
	IdemBegin  = redis.NewScript(idemBeginLua)
	IdemFinish = redis.NewScript(preludeLua + idemFinishLua)
)

// Keys is the naming of one lock's Redis names: the lock key, its fence
// counter and its release channel share the hash tag {key}, so under
// Cluster they live in one slot.
type Keys struct{ Prefix string }

// Lock is the name holding the holder's token.
func (k Keys) Lock(key string) string { return k.Prefix + "{" + key + "}" }

// Fence is the name of the key's fence counter.
func (k Keys) Fence(key string) string { return k.Prefix + "{" + key + "}:fence" }

// Owner is the name of the hash recording an owner's holds (reentrancy).
func (k Keys) Owner(key string) string { return k.Prefix + "{" + key + "}:owner" }

// Queue is the sorted set of processes waiting for key, in arrival order.
func (k Keys) Queue(key string) string { return k.Prefix + "{" + key + "}:q" }

// QueueExpiry is the hash of the queue members' expiries.
func (k Keys) QueueExpiry(key string) string { return k.Prefix + "{" + key + "}:qx" }

// Channel is the channel a release of key is announced on.
func (k Keys) Channel(key string) string { return k.Prefix + "{" + key + "}:release" }

// Run runs script and returns its reply, or an error matching ctx.Err() as
// soon as ctx ends, whatever the client's own timeouts (go-redis only
// honours a context's deadline on the socket with ContextTimeoutEnabled).
// When it returns early, the request goes on in the background, tracked by
// wg, and late — if not nil — receives its reply, to undo what it did.
func Run(ctx context.Context, wg *bg.Group, c redis.Scripter, script *redis.Script,
	keys []string, late func(*redis.Cmd), args ...any) *redis.Cmd {
	if ctx.Done() == nil {
		return script.Run(ctx, c, keys, args...)
	}
	if err := ctx.Err(); err != nil {
		cmd := redis.NewCmd(ctx)
		cmd.SetErr(err)
		return cmd
	}
	reply := make(chan *redis.Cmd, 1)
	wg.Go(func() {
		cmd := script.Run(context.WithoutCancel(ctx), c, keys, args...)
		reply <- cmd
	})
	select {
	case cmd := <-reply:
		return cmd
	case <-ctx.Done():
		if late != nil {
			wg.Go(func() { late(<-reply) })
		}
		cmd := redis.NewCmd(ctx)
		cmd.SetErr(ctx.Err())
		return cmd
	}
}

// AcquireReply is the acquire script's answer: Code 1 (taken, N = fence),
// 2 (re-entered by its owner, N = fence, Token = the owner's token), 0
// (held, N = the holder's PTTL in ms), -1 (arrived after the deadline).
type AcquireReply struct {
	Code  int64
	N     int64
	Token string
}

// ParseAcquire reads the acquire script's reply.
func ParseAcquire(cmd *redis.Cmd) (AcquireReply, error) {
	v, err := cmd.Slice()
	if err != nil {
		return AcquireReply{}, err
	}
	var r AcquireReply
	ok := len(v) >= 2
	if ok {
		r.Code, ok = v[0].(int64)
	}
	if ok {
		r.N, ok = v[1].(int64)
	}
	if ok && r.Code == 2 {
		ok = len(v) == 3
		if ok {
			r.Token, ok = v[2].(string)
		}
	}
	if !ok {
		return AcquireReply{}, fmt.Errorf("unexpected acquire script reply %v", v)
	}
	return r, nil
}

// Records names an idempotency record's Redis keys: the record hash, its
// fence counter and its completion channel share the hash tag {key}.
type Records struct{ Prefix string }

// Record is the name of key's record hash.
func (r Records) Record(key string) string { return r.Prefix + "{" + key + "}" }

// Fence is the name of key's fence counter.
func (r Records) Fence(key string) string { return r.Prefix + "{" + key + "}:fence" }

// Channel is where completion and abandonment of key are announced.
func (r Records) Channel(key string) string { return r.Prefix + "{" + key + "}:done" }

// BeginReply is the idem_begin script's answer: Code 1 (claimed, N =
// fence), 2 (in flight, N = PTTL), 3 (completed, N = PTTL, Result), 4
// (another fingerprint, N = PTTL), -2 (not our record, Reason).
type BeginReply struct {
	Code   int64
	N      int64
	Result []byte
	Reason string
}

// ParseBegin reads the idem_begin script's reply.
func ParseBegin(cmd *redis.Cmd) (BeginReply, error) {
	v, err := cmd.Slice()
	if err != nil {
		return BeginReply{}, err
	}
	var r BeginReply
	ok := len(v) >= 2
	if ok {
		r.Code, ok = v[0].(int64)
	}
	switch {
	case !ok:
	case r.Code == -2:
		r.Reason, ok = v[1].(string)
	case r.Code == 3:
		var res string
		r.N, ok = v[1].(int64)
		if ok && len(v) == 3 {
			res, ok = v[2].(string)
			r.Result = []byte(res)
		} else {
			ok = false
		}
	default:
		r.N, ok = v[1].(int64)
	}
	if !ok {
		return BeginReply{}, fmt.Errorf("unexpected begin script reply %v", v)
	}
	return r, nil
}
