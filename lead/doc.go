// Package lead runs a loop on exactly one replica at a time (leader
// election): an outbox relay, a queue poller, a cache warmer.
//
//	err := lead.Run(ctx, store, "outbox-relay", func(ctx context.Context, l lock.Lease) error {
//		return relay.Loop(ctx, l.Fence()) // until ctx ends: leadership lost, or Run's ctx
//	})
//
// Every replica calls Run with the same key on the same store (any
// lock.Locker: every oncekit driver). One of them leads: it holds the
// key's lock, kept alive by a lock.Mutex, and runs the loop. Its context
// ends as soon as leadership is lost (a refresh that failed, a store that
// did not answer before the lease ran out), before another replica can
// take the key; the lease's fence goes to what the loop writes, so that a
// leader paused past its lease cannot overwrite its successor's writes.
// When a leader dies, its lease runs out and another replica takes over
// within the TTL (WithTTL). When the loop returns, the leader lets go and
// all replicas compete again after a pause (WithRetryDelay).
//
// Elector answers "do I lead?" for code that asks instead of being
// called: its IsLeader is go-co-op/gocron v2's Elector
// (gocron.WithDistributedElector).
package lead
