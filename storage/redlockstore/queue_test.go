package redlockstore_test

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/storage/internal/rediskit"
	"github.com/oncekit/oncekit/storage/redlockstore"
)

// A key reserved, on the key's leader node and two more, for a waiter a
// release woke and which never comes (it died right after): a process that
// finds the other two nodes free holds them for a split vote, sees the
// rival on the leader node, and waits. The reservation ends after the wake
// grace, and nothing announces that: the waiter must try again then, not
// sleep out the recheck interval.
func TestSplitWaitEndsWithRivalReservation(t *testing.T) {
	addrs := testenv.RedisAddrs(t, 5)[:5]
	cs := clients(t, addrs)
	// Wake grace: 4 × the maximum backoff, 400 ms. A recheck far longer
	// than the grace shows which of the two the waiter waited for.
	s := newStore(t, cs, redlockstore.WithRecheckInterval(10*time.Second))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// A key whose leader node (FNV-1a of the key, modulo the node count,
	// as redlockstore picks it) is among nodes 0–2.
	var key string
	for i := 0; ; i++ {
		key = fmt.Sprintf("reserved-%d-%d", time.Now().UnixNano(), i)
		h := fnv.New32a()
		h.Write([]byte(key))
		if h.Sum32()%5 < 3 {
			break
		}
	}
	q, qx := "oncekit:redlock:{"+key+"}:q", "oncekit:redlock:{"+key+"}:qx"
	for _, c := range cs[:3] {
		c := c.(*redis.Client)
		now, err := c.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		// The woken member, first in the queue, whose place ends within the
		// grace: the key is kept for it until then.
		if err := c.ZAdd(ctx, q, redis.Z{Score: 0, Member: "gone"}).Err(); err != nil {
			t.Fatal(err)
		}
		if err := c.HSet(ctx, qx, "gone", now.Add(300*time.Millisecond).UnixMilli()).Err(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Del(context.Background(), q, qx) })
	}

	start := time.Now()
	l, err := s.Acquire(ctx, key, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	waited := time.Since(start)
	defer l.Release(context.Background())
	if waited > 2*time.Second {
		t.Fatalf("the waiter got the key after %s; want soon after the reservation ended (300 ms), not the recheck interval",
			waited.Round(time.Millisecond))
	}
}

// A process that found other processes queued for a key on a majority of
// the nodes waits for it next time as a member of the queues from its first
// round: one round per wait instead of two. (A process that only takes the
// key itself never queues early: see keep.Marks in Acquire.)
func TestCrowdedKeyQueuedFromFirstRound(t *testing.T) {
	addrs := testenv.RedisAddrs(t, 5)[:5]
	var rt counter
	a := newStore(t, clients(t, addrs, &rt))
	b := newStore(t, clients(t, addrs))
	c := newStore(t, clients(t, addrs))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	key := fmt.Sprintf("crowded-%d", time.Now().UnixNano())

	// turn: b holds the key, c waits in its queues, and a asks for it;
	// requests is how many requests a sent before it was waiting.
	turn := func() (requests int64) {
		t.Helper()
		held, err := b.Acquire(ctx, key, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		cGot := make(chan error, 1)
		go func() {
			l, err := c.Acquire(ctx, key, 10*time.Second)
			if err == nil {
				time.Sleep(10 * time.Millisecond)
				err = l.Release(ctx)
			}
			cGot <- err
		}()
		time.Sleep(200 * time.Millisecond) // c queued on the nodes
		before := rt.N.Load()
		aGot := acquireReleasing(ctx, a, key)
		time.Sleep(200 * time.Millisecond) // a waiting
		requests = rt.N.Load() - before
		if err := held.Release(ctx); err != nil {
			t.Fatal(err)
		}
		for _, ch := range []<-chan error{cGot, aGot} {
			if err := <-ch; err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(50 * time.Millisecond) // a's release is not recent any more
		return requests
	}
	// A round in the queues goes to the key's queue nodes only (a
	// majority: the other nodes would only answer busy).
	nodes, queue := int64(len(addrs)), int64(len(addrs)/2+1)
	if n := turn(); n < nodes+queue {
		t.Errorf("first wait: %d requests before waiting, want at least two rounds (%d): a first attempt, then one in the queues", n, nodes+queue)
	}
	// The mark lasts a second: on a loaded machine a turn can take longer
	// than that, and its wait begins with a first attempt again. A Store
	// that never queues early never sends one round.
	var counts []int64
	for range 3 {
		n := turn()
		if n == queue {
			return
		}
		counts = append(counts, n)
	}
	t.Errorf("the key seen crowded: %v requests before waiting in three turns, want one round (%d) in the queues", counts, queue)
}

// delayRelease holds back the release scripts a client sends by d: a node
// that processes a release later than the others.
type delayRelease struct{ d time.Duration }

func (h delayRelease) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h delayRelease) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if args := cmd.Args(); cmd.Name() == "evalsha" && len(args) > 1 &&
			(args[1] == rediskit.Release.Hash() || args[1] == rediskit.ReleaseNew.Hash()) {
			time.Sleep(h.d)
		}
		return next(ctx, cmd)
	}
}

func (h delayRelease) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A waiter woken on its own channel by the first node that processed a
// release waits until a majority of the nodes have announced it before it
// tries again: the other nodes may not have processed the release yet, and
// an attempt sent at once would find the key still held on them and cost
// a round. Here four of the five nodes get the holder's release 300 µs
// after the first; the waiter takes the key in one round.
func TestWokenWaiterWaitsForMajority(t *testing.T) {
	addrs := testenv.RedisAddrs(t, 5)[:5]
	cs := clients(t, addrs)
	late := clients(t, addrs[1:], delayRelease{300 * time.Microsecond})
	holder := newStore(t, append(cs[:1:1], late...))
	var rt counter
	waiter := newStore(t, clients(t, addrs, &rt))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	key := fmt.Sprintf("gather-%d", time.Now().UnixNano())
	for round := range 5 {
		held, err := holder.Acquire(ctx, key, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		got := acquireReleasing(ctx, waiter, key)
		time.Sleep(200 * time.Millisecond) // the waiter queued on the nodes
		before := rt.N.Load()
		if err := held.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-got; err != nil {
			t.Fatal(err)
		}
		// One round to take the key and one to release it, and a few
		// clean-up requests (the queues left on the nodes the round did
		// not count); a second round to take it makes at least 15.
		if n, most := rt.N.Load()-before, int64(3*len(addrs)-1); n > most {
			t.Errorf("round %d: the woken waiter sent %d requests to take and release the key, want at most %d (one round to take it)", round, n, most)
		}
		time.Sleep(50 * time.Millisecond) // neither Store's release is recent any more
	}
}

// queueNodes is what the Store picks as key's queue nodes among n: the
// key's leader node (FNV-1a of the key, modulo n) and the quorum − 1
// nodes after it.
func queueNodes(key string, n int) map[int]bool {
	h := fnv.New32a()
	h.Write([]byte(key))
	leader := int(h.Sum32() % uint32(n))
	q := map[int]bool{}
	for i := range n/2 + 1 {
		q[(leader+i)%n] = true
	}
	return q
}

// Waiting processes queue on the key's queue nodes only — a majority —
// and the other nodes keep the key as a key nobody waits for (no queue,
// no flag), so that a hand-off costs them the short scripts. The woken
// waiter still gets the key. The queue nodes follow the nodes' addresses,
// not the order a process lists them in: the waiter here lists them in
// reverse.
func TestWaitersQueueOnQueueNodesOnly(t *testing.T) {
	addrs := testenv.RedisAddrs(t, 5)[:5]
	cs := clients(t, addrs)
	reversed := slices.Clone(addrs)
	slices.Reverse(reversed)
	holder, waiter := newStore(t, cs), newStore(t, clients(t, reversed))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	key := fmt.Sprintf("queue-nodes-%d", time.Now().UnixNano())
	qn := queueNodes(key, len(addrs))

	held, err := holder.Acquire(ctx, key, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	lockKey, q := "oncekit:redlock:{"+key+"}", "oncekit:redlock:{"+key+"}:q"
	// Acquire returns with a majority; the other nodes' answers may still
	// be on their way (a waiter sent first would take those nodes for a
	// moment). Wait until the holder holds every node.
	for i, c := range cs {
		for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			if n, err := c.(*redis.Client).Exists(ctx, lockKey).Result(); err == nil && n == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("node %d: the holder's key is not there", i)
			}
		}
	}
	got := acquireReleasing(ctx, waiter, key)
	time.Sleep(200 * time.Millisecond) // the waiter queued
	for i, c := range cs {
		c := c.(*redis.Client)
		members, err := c.ZCard(ctx, q).Result()
		if err != nil {
			t.Fatal(err)
		}
		v, err := c.Get(ctx, lockKey).Result()
		if err != nil {
			t.Fatal(err)
		}
		flagged := v[len(v)-1] == 'w'
		if qn[i] && (members != 1 || !flagged) {
			t.Errorf("queue node %d: %d queued, value %q; want the waiter queued and the key flagged", i, members, v)
		}
		if !qn[i] && (members != 0 || flagged) {
			t.Errorf("node %d (not a queue node): %d queued, value %q; want no queue and no flag", i, members, v)
		}
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the waiter was not woken by the release")
	}
}

// A key a release reserved on its queue nodes for the waiter it woke
// cannot be taken by another process meanwhile (bounded barging): every
// majority includes a queue node. Here the key is free on every node, and
// reserved on the queue nodes for a woken member that has not come yet.
func TestReservationOnQueueNodesBarsOthers(t *testing.T) {
	addrs := testenv.RedisAddrs(t, 5)[:5]
	cs := clients(t, addrs)
	s := newStore(t, cs)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	key := fmt.Sprintf("reserved-q-%d", time.Now().UnixNano())
	lockKey, q, qx := "oncekit:redlock:{"+key+"}", "oncekit:redlock:{"+key+"}:q", "oncekit:redlock:{"+key+"}:qx"
	for i := range queueNodes(key, len(cs)) {
		c := cs[i].(*redis.Client)
		now, err := c.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		// What a release leaves for the member it woke: a tombstone that
		// says a process is queued, and the member's grace.
		if err := c.Set(ctx, lockKey, "L1|~|0|w", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		if err := c.ZAdd(ctx, q, redis.Z{Score: 0, Member: "woken"}).Err(); err != nil {
			t.Fatal(err)
		}
		// (The grace is 4 × the maximum backoff, 400 ms here.)
		if err := c.HSet(ctx, qx, "woken", now.Add(395*time.Millisecond).UnixMilli()).Err(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Del(context.Background(), lockKey, q, qx) })
	}
	if l, err := s.TryAcquire(ctx, key, 10*time.Second); err == nil {
		l.Release(ctx)
		t.Fatal("TryAcquire took a key reserved on its queue nodes for a woken waiter")
	}
	// The nodes it took (answers that came after its round ended
	// included) are given back — in the background, so on a loaded
	// machine allow a few seconds, well within the attempt's 10 s TTL.
	// Given back is deleted, or a tombstone with no flags (a free key
	// that keeps a fence above the node's clock: release_fast.lua).
	for i, c := range cs {
		if queueNodes(key, len(cs))[i] {
			continue
		}
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			v, err := c.(*redis.Client).Get(ctx, lockKey).Result()
			if err == redis.Nil || err == nil && strings.HasPrefix(v, "L1|~|") && strings.HasSuffix(v, "|") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("node %d: the failed attempt left the key as %q (%v)", i, v, err)
			}
		}
	}
	// Once the grace has run out, the key is free for anyone.
	time.Sleep(450 * time.Millisecond)
	l, err := s.TryAcquire(ctx, key, 10*time.Second)
	if err != nil {
		t.Fatalf("after the grace: %v", err)
	}
	l.Release(ctx)
}

// acquireReleasing acquires key on s in the background (for 10 s) and
// releases it at once; the channel gets the error of either, or nil.
func acquireReleasing(ctx context.Context, s *redlockstore.Store, key string) <-chan error {
	got := make(chan error, 1)
	go func() {
		l, err := s.Acquire(ctx, key, 10*time.Second)
		if err == nil {
			err = l.Release(ctx)
		}
		got <- err
	}()
	return got
}

// Three processes' TryAcquires of one free key at the same instant split
// the nodes between them often (2, 2 and 1 of five): without a settlement
// nobody gets the key, and a scheduler whose replicas all try at their
// tick loses the tick. The one holding the key's leader node completes its
// majority while the others give theirs back: exactly one wins each time.
func TestSimultaneousTryAcquiresOneWins(t *testing.T) {
	addrs := testenv.RedisAddrs(t, 5)[:5]
	for _, mode := range []struct {
		name string
		opts []redlockstore.Option
	}{
		{"fenced", nil},
		{"unfenced", []redlockstore.Option{redlockstore.WithoutFencing()}},
	} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			var stores []*redlockstore.Store
			for range 3 {
				stores = append(stores, newStore(t, clients(t, addrs), mode.opts...))
			}
			ctx := t.Context()
			const rounds = 400
			var none int
			for r := range rounds {
				key := fmt.Sprintf("try-%s-%d-%d", mode.name, time.Now().UnixNano(), r)
				start := make(chan struct{})
				won := make(chan lock.Lease, len(stores))
				errs := make(chan error, len(stores))
				var wg sync.WaitGroup
				for _, s := range stores {
					wg.Go(func() {
						<-start
						l, err := s.TryAcquire(ctx, key, 2*time.Second)
						if err != nil {
							errs <- err
							return
						}
						won <- l
					})
				}
				close(start)
				wg.Wait()
				close(won)
				close(errs)
				n := 0
				for l := range won {
					n++
					_ = l.Release(ctx)
				}
				for err := range errs {
					if !errors.Is(err, lock.ErrNotAcquired) {
						t.Fatalf("round %d: %v", r, err)
					}
				}
				switch {
				case n > 1:
					t.Fatalf("round %d: %d TryAcquires won one key", r, n)
				case n == 0:
					none++
				}
			}
			if none > 0 {
				t.Errorf("%d of %d rounds of three simultaneous TryAcquires on a free key: nobody got it", none, rounds)
			}
		})
	}
}
