package rediskit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrNotReplicated reports a write that fewer replicas acknowledged than
// the Store asks for (WAIT) within its timeout: the lease or claim it
// would have granted was given back.
var ErrNotReplicated = errors.New("redis: the replicas did not acknowledge the write in time")

// Replication is the acknowledgement a driver asks of a primary's
// replicas after each write that grants or keeps a lease or a claim:
// WAIT Replicas Timeout, in the same round trip as the script.
type Replication struct {
	Replicas int
	Timeout  time.Duration
}

// acked reports whether script's writes wait for the replicas: every
// script that grants, keeps or completes a lease or a claim; not a
// release, whose loss in a failover only keeps a key held until its TTL.
func (b *Base) acked(script *redis.Script) bool {
	return b.Replication.Replicas > 0 && script != Release && script != LeaveQueue
}

// runAcked runs script and WAIT in one pipeline on the primary that holds
// keys[0]. A reply whose WAIT counted too few replicas carries the
// script's value and ErrNotReplicated as its error (valueOf reads the
// value): the caller gives back what it took, as after any error that is
// not a reply.
func (b *Base) runAcked(ctx context.Context, c redis.Scripter, script *redis.Script, keys []string,
	late func(*redis.Cmd), args ...any) *redis.Cmd {
	return runCmd(ctx, &b.BG, EnforcesDeadlines(c), redis.NewCmd, func(ctx context.Context) *redis.Cmd {
		p, err := primaryOf(ctx, c, keys)
		if err != nil {
			cmd := redis.NewCmd(ctx)
			cmd.SetErr(err)
			return cmd
		}
		for attempt := 0; ; attempt++ {
			pipe := p.Pipeline()
			cmd := pipe.EvalSha(ctx, script.Hash(), keys, args...)
			wait := pipe.Do(ctx, "WAIT", b.Replication.Replicas, max(b.Replication.Timeout.Milliseconds(), 1))
			_, _ = pipe.Exec(ctx)
			if err := cmd.Err(); err != nil && attempt == 0 && strings.HasPrefix(err.Error(), "NOSCRIPT") {
				if err := script.Load(ctx, p).Err(); err != nil {
					cmd.SetErr(err)
					return cmd
				}
				continue
			}
			if cmd.Err() != nil {
				return cmd
			}
			n, err := wait.Int64()
			switch {
			case err != nil:
				cmd.SetErr(fmt.Errorf("%w: WAIT: %w", ErrNotReplicated, err))
			case n < int64(b.Replication.Replicas):
				cmd.SetErr(fmt.Errorf("%w: %d of %d replicas within %s", ErrNotReplicated, n, b.Replication.Replicas, b.Replication.Timeout))
			}
			return cmd
		}
	}, late)
}

// pipeliner is a client that can send a pipeline to one server.
type pipeliner interface {
	redis.Scripter
	Pipeline() redis.Pipeliner
}

// primaryOf is the client of the server that holds keys: c itself, or in a
// Cluster the primary of their slot (a WAIT must reach the server that
// took the write).
func primaryOf(ctx context.Context, c redis.Scripter, keys []string) (pipeliner, error) {
	if ap, ok := c.(*autoPipeline); ok {
		c = ap.Pipeliner
	}
	if cc, ok := c.(*redis.ClusterClient); ok {
		node, err := cc.MasterForKey(ctx, keys[0])
		if err != nil {
			return nil, err
		}
		return node, nil
	}
	p, ok := c.(pipeliner)
	if !ok {
		return nil, fmt.Errorf("rediskit: %T cannot pipeline a WAIT after its writes", c)
	}
	return p, nil
}

// valueOf is cmd with the error of a write the replicas did not
// acknowledge taken off: what the script answered, for the caller to give
// back.
func valueOf(cmd *redis.Cmd) *redis.Cmd {
	if !errors.Is(cmd.Err(), ErrNotReplicated) {
		return cmd
	}
	v := redis.NewCmd(context.Background())
	v.SetVal(cmd.Val())
	return v
}
