package testenv

import (
	"context"
	"slices"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisCounter is a go-redis hook that counts the requests a client sends,
// except those that set up a connection (HELLO, CLIENT SETINFO, CLIENT
// MAINT_NOTIFICATIONS), which go-redis sends once per new connection, and
// the other set-up requests of setup. A pipeline counts as one request.
type RedisCounter struct{ N atomic.Int64 }

// setup reports connection set-up, clock reading (TIME, once a minute
// per client, in the background: see rediskit.Base.ServerDeadline) and the
// server's version (INFO, once per node when a Store first subscribes
// there: see redisnotify), which the round-trip counts leave out.
func setup(cmd redis.Cmder) bool {
	n := cmd.Name()
	return n == "hello" || n == "client" || n == "time" || n == "info"
}

// DialHook implements redis.Hook.
func (c *RedisCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook implements redis.Hook.
func (c *RedisCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !setup(cmd) {
			c.N.Add(1)
		}
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook implements redis.Hook.
func (c *RedisCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if slices.ContainsFunc(cmds, func(c redis.Cmder) bool { return !setup(c) }) {
			c.N.Add(1)
		}
		return next(ctx, cmds)
	}
}

// SlowScript is a go-redis hook that holds back every call of one script
// (by its SHA) by Delay, to land its reply after something else happened.
type SlowScript struct {
	SHA   string
	Delay time.Duration
}

func (h SlowScript) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h SlowScript) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if args := cmd.Args(); len(args) > 1 && cmd.Name() == "evalsha" && args[1] == h.SHA {
			time.Sleep(h.Delay)
		}
		return next(ctx, cmd)
	}
}

func (h SlowScript) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
