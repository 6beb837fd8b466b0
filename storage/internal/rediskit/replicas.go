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
var ErrNotReplicated = errors.New("redisstore: the replicas did not acknowledge the write in time")

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
	return b.Replication.Replicas > 0 && script != Release && script != ReleaseNew && script != LeaveQueue
}

// runAcked runs script and WAIT in one pipeline on the primary that holds
// keys[0]. A reply whose WAIT counted too few replicas carries the
// script's value and ErrNotReplicated as its error (valueOf reads the
// value): the caller gives back what it took, as after any error that is
// not a reply.
func (b *Base) runAcked(ctx context.Context, c redis.Scripter, script *redis.Script, keys []string,
	late func(*redis.Cmd), args ...any) *redis.Cmd {
	return runCmd(ctx, &b.BG, EnforcesDeadlines(c), redis.NewCmd, func(ctx context.Context) *redis.Cmd {
		loaded := false
		for attempt := 0; ; attempt++ {
			p, err := primaryOf(ctx, c, keys)
			if err != nil {
				cmd := redis.NewCmd(ctx)
				cmd.SetErr(err)
				return cmd
			}
			pipe := p.Pipeline()
			cmd := pipe.EvalSha(ctx, script.Hash(), keys, args...)
			wait := pipe.Do(ctx, "WAIT", b.Replication.Replicas, max(b.Replication.Timeout.Milliseconds(), 1))
			_, _ = pipe.Exec(ctx)
			if err := cmd.Err(); err != nil && !loaded && strings.HasPrefix(err.Error(), "NOSCRIPT") {
				loaded = true
				if err := script.Load(ctx, p).Err(); err != nil {
					cmd.SetErr(err)
					return cmd
				}
				continue
			}
			if cc := clusterOf(c); cc != nil && attempt < 8 && movedOrGone(cmd.Err()) && ctx.Err() == nil {
				// The slot's primary changed (a failover, a resharding) and
				// this client's map of the cluster is stale: reload it and
				// ask the new primary. (A script that reached no server ran
				// nowhere; MOVED and TRYAGAIN ran nothing either.)
				cc.ReloadState(ctx)
				time.Sleep(time.Duration(attempt+1) * 50 * time.Millisecond)
				continue
			}
			if cmd.Err() != nil {
				return cmd
			}
			if !wrote(script, cmd) {
				return cmd // nothing granted or kept (a busy key, a claim not ours): nothing to wait for
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

// wrote reports whether script's reply says it granted, kept or completed
// something that a failover must not lose: a key taken or re-entered, a
// claim made, a refresh or a finish that was the caller's, an effect
// committed. Other replies (busy, in flight, not ours) wrote nothing the
// caller relies on.
func wrote(script *redis.Script, cmd *redis.Cmd) bool {
	switch script {
	case Acquire, AcquireNew:
		r, err := ParseAcquire(cmd)
		return err != nil || r.Code == AcquireTaken || r.Code == AcquireReentered
	case IdemBegin:
		r, err := ParseBegin(cmd)
		return err != nil || r.Code == BeginClaimed || r.Code == BeginCompleted
	case Refresh, IdemFinish:
		ok, err := ParseFlag(cmd)
		return err != nil || ok
	case Transfer:
		code, _, _, err := ParseTransfer(cmd)
		return err != nil || code == TransferDone
	}
	return true // effects and the rest: wait
}

// clusterOf is c's Cluster client, or nil.
func clusterOf(c redis.Scripter) *redis.ClusterClient {
	if ap, ok := c.(*autoPipeline); ok {
		c = ap.Pipeliner
	}
	cc, _ := c.(*redis.ClusterClient)
	return cc
}

// movedOrGone reports an error after which a Cluster client should look
// for the slot's primary again: the node refused the connection (it is
// down), or it answered that another node serves the slot (MOVED, ASK) or
// that the slot is moving or the cluster is failing over (TRYAGAIN,
// CLUSTERDOWN). None of them ran the script.
func movedOrGone(err error) bool {
	if err == nil {
		return false
	}
	msg := err.Error()
	for _, p := range []string{"MOVED ", "ASK ", "TRYAGAIN", "CLUSTERDOWN"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return isRefused(err)
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
	if cc := clusterOf(c); cc != nil {
		node, err := cc.MasterForKey(ctx, keys[0])
		if err != nil {
			return nil, err
		}
		return node, nil
	}
	p, ok := c.(pipeliner)
	if !ok {
		return nil, fmt.Errorf("a %T cannot pipeline a WAIT after its writes (WithReplicas needs a go-redis client)", c)
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
