package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/internal/redislua"
	"github.com/oncekit/oncekit/internal/redisnotify"
	"github.com/oncekit/oncekit/internal/token"
)

// AcquireAll implements lock.MultiLocker. Outside Redis Cluster every key
// lives on one server, so the keys are taken in one script, all or nothing,
// in one round trip; while one of them is held, it waits for that key's
// release message or remaining TTL and tries again. Under Cluster, and for
// an owner (lock.WithOwner), it takes them one by one in canonical order
// (lock.AcquireEach).
func (s *Store) AcquireAll(ctx context.Context, keys []string, ttl time.Duration) (*lock.MultiLease, error) {
	if _, cluster := s.client.(*redis.ClusterClient); cluster || lock.Owner(ctx) != "" {
		return lock.AcquireEach(ctx, s, keys, ttl)
	}
	keys, err := lock.CanonicalKeys(keys)
	if err != nil {
		return nil, err
	}
	if err := lock.ValidateTTL(ttl); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, errors.Join(lock.ErrNotAcquired, err)
	}
	var (
		watched string
		w       *watchHandle
		backoff = s.opts.minBackoff
		timer   = time.NewTimer(time.Hour)
	)
	defer timer.Stop()
	defer func() { w.close() }()
	for {
		leases, blocked, pttl, err := s.attemptAll(ctx, keys, ttl)
		if err != nil {
			return nil, err
		}
		if leases != nil {
			return lock.NewMultiLease(leases), nil
		}
		if blocked != watched {
			// Subscribe to the key in the way, then try again at once.
			w.close()
			sw, err := s.sub.Watch(ctx, s.channel(blocked))
			if err != nil {
				return nil, err
			}
			w, watched = &watchHandle{s: s, w: sw}, blocked
			continue
		}
		wait := s.opts.recheck
		switch {
		case !w.w.Subscribed() || pttl < 0:
			wait = min(wait, backoff/2+rand.N(backoff/2+1))
			backoff = min(2*backoff, s.opts.maxBackoff)
		case pttl < wait:
			wait = pttl + time.Millisecond
		}
		timer.Reset(wait)
		select {
		case <-w.w.Wake():
		case <-timer.C:
		case <-s.sub.Closed():
			return nil, fmt.Errorf("redisstore: acquire all: %w", lock.ErrClosed)
		case <-ctx.Done():
			return nil, errors.Join(lock.ErrNotAcquired, ctx.Err())
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
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
func (s *Store) attemptAll(ctx context.Context, keys []string, ttl time.Duration) ([]lock.Lease, string, time.Duration, error) {
	start := time.Now()
	var deadline int64
	if d, ok := ctx.Deadline(); ok {
		deadline = d.UnixMilli()
	}
	names := make([]string, 0, 2*len(keys))
	args := []any{ttl.Milliseconds(), deadline}
	toks := make([]string, len(keys))
	for i, k := range keys {
		names = append(names, s.lockKey(k), s.fenceKey(k))
		toks[i] = token.New()
		args = append(args, toks[i])
	}
	undo := func() {
		cctx, cancel := lock.CleanupContext(ctx)
		defer cancel()
		for i, k := range keys {
			_ = redislua.Release.Run(cctx, s.client, []string{s.lockKey(k), s.names.Owner(k)},
				toks[i], s.channel(k), s.modeArg()).Err()
		}
	}
	late := func(cmd *redis.Cmd) {
		if v, err := cmd.Int64Slice(); err == nil && len(v) > 0 && v[0] == 1 {
			undo()
		}
	}
	v, err := redislua.Run(ctx, &s.bg, s.client, redislua.AcquireAll, names, late, args...).Int64Slice()
	if err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, "", 0, errors.Join(lock.ErrNotAcquired, ctxErr)
		}
		if !isRedisReply(err) {
			s.bg.Go(undo)
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
			l := newLease(s, k, toks[i], uint64(v[1+i]), start, ttl, "")
			s.adopt(l)
			leases[i] = l
		}
		return leases, "", 0, nil
	}
	return nil, "", 0, fmt.Errorf("redisstore: acquire all: unexpected script reply %v", v)
}

var _ lock.MultiLocker = (*Store)(nil)
