package redisstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/lock/lockdriver"
	"github.com/oncekit/oncekit/storage/internal/rediskit"
	"github.com/oncekit/oncekit/storage/internal/redisnotify"
	"github.com/oncekit/oncekit/storage/internal/token"
)

// AcquireAll implements lockdriver.MultiLocker. Outside Redis Cluster every key
// lives on one server, so the keys are taken in one script, all or nothing,
// in one round trip; while one of them is held, it waits in that key's
// queue of waiting processes, in its turn like a single-key waiter (a
// release wakes it on a channel of its own), or for the holder's remaining
// TTL, and tries again. Under Cluster, for an owner (lock.WithOwner) and
// with WithReplicas, it reports errors.ErrUnsupported and lock.AcquireAll
// takes the keys one by one in canonical order.
func (s *Store) AcquireAll(ctx context.Context, keys []string, ttl time.Duration) ([]lock.Lease, error) {
	if _, cluster := s.raw.(*redis.ClusterClient); cluster || lock.Owner(ctx) != "" || s.base.Replication.Replicas > 0 {
		return nil, fmt.Errorf("redisstore: acquire all: keys in several slots, an owner or replica acknowledgement: %w", errors.ErrUnsupported)
	}
	if err := ctx.Err(); err != nil {
		return nil, lockdriver.NotAcquired(ctx)
	}
	if s.closed.Load() {
		return nil, fmt.Errorf("redisstore: acquire all: %w", lock.ErrClosed)
	}
	// The call waits in the queue of the key in its way as a member of its
	// own (not the Store's: its turn is not a single-key waiter's), woken
	// on its own channel like any waiter, or on the general channel.
	member := s.base.Member + "." + token.New()
	var (
		watched string
		own, w  *watchHandle
		backoff = s.base.MinBackoff
		timer   = time.NewTimer(time.Hour)
	)
	defer timer.Stop()
	defer func() { own.close(); w.close() }()
	defer func() {
		if watched != "" { // leaving without the keys: give the place up
			ctx, cancel := context.WithTimeout(context.Background(), lockdriver.ReleaseTimeout)
			defer cancel()
			_ = s.leaveQueueAs(ctx, watched, member)
		}
	}()
	for {
		leases, blocked, pttl, err := s.attemptAll(ctx, keys, ttl, member)
		if err != nil {
			return nil, err
		}
		if leases != nil {
			watched = "" // the script left every queue
			return leases, nil
		}
		if blocked != watched {
			// Listen on the key in the way (the script queued us there),
			// leave the queue of the one before, then try again at once.
			own.close()
			w.close()
			ow, err := s.watch(ctx, s.base.Keys.MemberChannel(blocked, member))
			if err != nil {
				return nil, err
			}
			gw, err := s.watch(ctx, s.base.Keys.Channel(blocked))
			if err != nil {
				s.sub.Unwatch(ow)
				return nil, err
			}
			if watched != "" {
				_ = s.leaveQueueAs(ctx, watched, member)
			}
			own, w, watched = &watchHandle{s: s, w: ow}, &watchHandle{s: s, w: gw}, blocked
			continue
		}
		timer.Reset(s.base.NextWait(own.w.Subscribed() && w.w.Subscribed(), pttl, &backoff))
		select {
		case <-own.w.Wake():
		case <-w.w.Wake():
		case <-timer.C:
		case <-s.sub.Closed():
			return nil, fmt.Errorf("redisstore: acquire all: %w", lock.ErrClosed)
		case <-ctx.Done():
			return nil, lockdriver.NotAcquired(ctx)
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

// leaveQueueAs removes member from key's waiting queue.
func (s *Store) leaveQueueAs(ctx context.Context, key, member string) error {
	return rediskit.LeaveQueue.Run(ctx, s.client, []string{s.base.Keys.Queue(key), s.base.Keys.QueueExpiry(key)}, member).Err()
}

type watchHandle struct {
	s *Store
	w *redisnotify.Watcher
}

func (h *watchHandle) close() {
	if h != nil {
		h.s.sub.Unwatch(h.w)
	}
}

// attemptAll runs the script once: the leases when every key was taken, or
// the first held key and its remaining TTL.
func (s *Store) attemptAll(ctx context.Context, keys []string, ttl time.Duration, member string) ([]lock.Lease, string, time.Duration, error) {
	start := time.Now()
	d, _ := ctx.Deadline()
	deadline := s.base.ServerDeadline(s.client, d)
	names := make([]string, 0, 3*len(keys))
	args := []any{ttl.Milliseconds(), deadline, member, (3 * s.base.Recheck).Milliseconds()}
	toks := make([]string, len(keys))
	for i, k := range keys {
		names = append(names, s.base.Keys.Lock(k), s.base.Keys.Queue(k), s.base.Keys.QueueExpiry(k))
		toks[i] = token.New()
		args = append(args, toks[i])
	}
	undo := func() {
		cctx, cancel := lockdriver.CleanupContext(ctx)
		defer cancel()
		for i, k := range keys {
			_, _ = s.base.Release(cctx, s.client, k, toks[i], false, 0, 0, false, 0)
		}
	}
	late := func(cmd *redis.Cmd) {
		if v, err := cmd.Int64Slice(); err == nil && len(v) > 0 && v[0] == 1 {
			undo()
		}
	}
	v, err := rediskit.Run(ctx, &s.base.BG, s.client, rediskit.AcquireAll, names, late, args...).Int64Slice()
	if err != nil {
		if ctx.Err() != nil {
			return nil, "", 0, lockdriver.NotAcquired(ctx)
		}
		if !rediskit.IsReply(err) {
			s.base.BG.Go(undo)
		}
		return nil, "", 0, fmt.Errorf("redisstore: acquire all: %w", err)
	}
	switch {
	case len(v) == 1 && v[0] == -1:
		return nil, "", 0, errors.Join(lock.ErrNotAcquired, context.DeadlineExceeded)
	case len(v) == 3 && v[0] == 0 && v[1] >= 1 && int(v[1]) <= len(keys):
		pttl := time.Duration(v[2]) * time.Millisecond
		if v[2] < 0 {
			pttl = -1
		}
		return nil, keys[v[1]-1], pttl, nil
	case len(v) == 1+len(keys) && v[0] == 1:
		leases := make([]lock.Lease, len(keys))
		for i, k := range keys {
			// The multi-key script reserves no fences: no local hand-off
			// without a round trip.
			l := s.makeLease(k, toks[i], hold{fence: uint64(v[1+i]), fences: 1, took: start}, 0, start.Add(ttl), "")
			s.adopt(l)
			leases[i] = l.Lease()
		}
		return leases, "", 0, nil
	}
	return nil, "", 0, fmt.Errorf("redisstore: acquire all: unexpected script reply %v", v)
}

var _ lockdriver.MultiLocker = (*Store)(nil)
