package redisstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/idem/idemtest"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/lock/locktest"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/storage/redisstore"
)

// failoverClient is a client of the primary that sentinels name, as go-redis
// builds it for a Sentinel deployment, closed at the end of the test.
func failoverClient(t testing.TB, sentinels []string, master string) *redis.Client {
	t.Helper()
	c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: master, SentinelAddrs: sentinels,
		ContextTimeoutEnabled: true, DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Through go-redis' failover client, with every lease and claim waiting
// for both replicas, the Store passes both suites.
func TestSentinelConformance(t *testing.T) {
	t.Parallel()
	sentinels, master := testenv.SentinelAddrs(t)
	opts := []redisstore.Option{redisstore.WithReplicas(2, 2*time.Second)}
	admin := failoverClient(t, sentinels, master)
	t.Run("locks", func(t *testing.T) {
		locktest.Run(t, locktest.Config{
			NewLocker:    func(t *testing.T) lock.Locker { return newStore(t, failoverClient(t, sentinels, master), opts...) },
			Reentrant:    true,
			FenceAtLeast: true, // InspectLock reports the hold's last fence
		})
	})
	t.Run("idem", func(t *testing.T) {
		idemtest.Run(t, idemtest.Config{
			NewStore: func(t *testing.T) idemdriver.Store { return newStore(t, failoverClient(t, sentinels, master), opts...) },
			Corrupt: func(t *testing.T, key string) {
				if err := admin.Set(context.Background(), "oncekit:idem:{"+key+"}", "garbage", time.Minute).Err(); err != nil {
					t.Fatal(err)
				}
			},
			Effect: redisEffect(admin),
		})
	})
}

// The hazard of a replicated Redis, on real processes: the primary grants
// a lock and a claim, dies before its replicas have them (their links hold the stream back,
// as a slow link would hold them back), and Sentinel promotes a
// replica without them. Without WithReplicas a second client takes the
// same lock and claim — two holders, two runs — while the first still
// believes it holds them. With WithReplicas, a grant the replicas did not
// acknowledge is given back (ErrNotReplicated), and one they did survives
// the failover: no second holder, no second run, fences keep growing.
func TestFailover(t *testing.T) {
	t.Parallel()
	for _, acked := range []bool{false, true} {
		name := "without-replicas-option"
		if acked {
			name = "with-replicas-option"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel() // (a group of its own)
			g := testenv.StartSentinelGroup(t, 2)
			var opts []redisstore.Option
			if acked {
				opts = append(opts, redisstore.WithReplicas(1, 300*time.Millisecond))
			}
			first := newStore(t, failoverClient(t, g.SentinelAddrs(), g.Master), opts...)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			const key, record = "failover-key", "failover-record"
			primary := g.Primary()
			g.HoldReplication() // as a slow link would: the replicas do not get the writes
			held, lockErr := first.Acquire(ctx, key, time.Minute)
			claim, beginErr := first.Begin(ctx, idemdriver.MustKey(record), "fp", time.Minute)
			if acked {
				// The replicas cannot acknowledge: nothing is granted.
				if !errors.Is(lockErr, redisstore.ErrNotReplicated) || !errors.Is(beginErr, redisstore.ErrNotReplicated) {
					t.Fatalf("with paused replicas: Acquire %v, Begin %v; want ErrNotReplicated", lockErr, beginErr)
				}
				g.ResumeReplication()
				if held, lockErr = first.Acquire(ctx, key, time.Minute); lockErr != nil {
					t.Fatal(lockErr)
				}
				if claim, beginErr = first.Begin(ctx, idemdriver.MustKey(record), "fp", time.Minute); beginErr != nil || claim.State != idemdriver.Acquired {
					t.Fatalf("Begin: %+v %v", claim, beginErr)
				}
			} else if lockErr != nil || beginErr != nil || claim.State != idemdriver.Acquired {
				t.Fatalf("Acquire %v, Begin %+v %v", lockErr, claim, beginErr)
			}

			primary.Kill()
			g.DropReplication() // what the primary had not sent dies with it
			promoted := g.WaitFailover(primary, 30*time.Second)
			t.Logf("%s promoted after the primary was killed", promoted.Addr)

			second := newStore(t, failoverClient(t, g.SentinelAddrs(), g.Master), opts...)
			var other lock.Lease
			var otherClaim idemdriver.Claim
			var err error
			for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
				// The new primary may refuse writes for a moment after its
				// promotion (READONLY): ask until it answers.
				other, err = second.TryAcquire(ctx, key, time.Minute)
				if err == nil || errors.Is(err, lock.ErrNotAcquired) || time.Now().After(deadline) {
					break
				}
			}
			otherClaim, beginErr = second.Begin(ctx, idemdriver.MustKey(record), "fp", time.Minute)
			if beginErr != nil {
				t.Fatal(beginErr)
			}
			select {
			case <-held.Done():
				t.Fatal("the first holder's lease ended: the failover was not hidden from it")
			default:
			}
			if !acked {
				// The hazard, shown: two holders, two runs.
				if err != nil || otherClaim.State != idemdriver.Acquired {
					t.Fatalf("after an unacknowledged grant and a failover: TryAcquire %v, Begin %v; "+
						"want both granted again (the documented hazard)", err, otherClaim.State)
				}
				if other.Fence() <= held.Fence() {
					t.Errorf("the second holder's fence %d is not above the first's %d (the clock floor)", other.Fence(), held.Fence())
				}
				t.Logf("without WithReplicas: a second holder (fence %d after %d) and a second run", other.Fence(), held.Fence())
				return
			}
			if !errors.Is(err, lock.ErrNotAcquired) {
				t.Fatalf("TryAcquire after the failover: %v, want the key still held", err)
			}
			if otherClaim.State != idemdriver.InFlight {
				t.Fatalf("Begin after the failover: %v, want the claim still in flight", otherClaim.State)
			}
			// The first holder carries on through the new primary.
			if err := held.Release(ctx); err != nil {
				t.Fatalf("Release through the new primary: %v", err)
			}
			if err := first.Complete(ctx, claim, []byte("once"), time.Minute); err != nil {
				t.Fatalf("Complete through the new primary: %v", err)
			}
			afterFailover(ctx, t, second, key, record, held.Fence())
		})
	}
}

// A key handed from one lease of a Store to another of its goroutines in
// one round trip (the hold had less than 7/8 of the waiter's TTL left)
// is a grant too: with WithReplicas, the waiter holds it only once a
// replica has its token. Replication is held while the holder releases:
// the waiter must not get a lease until it is resumed, and then its token
// is on the replica.
func TestFailoverHandOff(t *testing.T) {
	g := testenv.StartSentinelGroup(t, 1)
	s := newStore(t, failoverClient(t, g.SentinelAddrs(), g.Master), redisstore.WithReplicas(1, 300*time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const key, ttl = "handoff-key", 2 * time.Second
	a, err := s.Acquire(ctx, key, ttl)
	for deadline := time.Now().Add(10 * time.Second); errors.Is(err, redisstore.ErrNotReplicated) && time.Now().Before(deadline); {
		a, err = s.Acquire(ctx, key, ttl) // a loaded machine's replica may lag past the timeout
	}
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		l   lock.Lease
		err error
	}
	waited := make(chan result, 1)
	go func() {
		l, err := s.Acquire(ctx, key, ttl) // a goroutine of the same Store: queued locally
		waited <- result{l, err}
	}()
	time.Sleep(400 * time.Millisecond) // the hold has less than 7/8 of ttl left: a hand-off in one round trip
	primary := g.Primary()
	var replica *testenv.RedisProcess
	for _, p := range g.Servers {
		if p != primary {
			replica = p
		}
	}
	g.HoldReplication()
	if err := a.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	var got result
	select {
	case got = <-waited:
		if got.err == nil {
			t.Fatalf("the waiter got the key (fence %d) while the replicas could not acknowledge the hand-off", got.l.Fence())
		}
		if !errors.Is(got.err, redisstore.ErrNotReplicated) {
			t.Fatalf("waiter: %v, want ErrNotReplicated", got.err)
		}
	case <-time.After(time.Second):
	}
	g.ResumeReplication()
	if got.l == nil && got.err == nil {
		got = <-waited // still waiting: it takes the key now
	}
	// The replica catches up on what was held back: until it has, a take
	// is still refused.
	for deadline := time.Now().Add(10 * time.Second); got.err != nil && errors.Is(got.err, redisstore.ErrNotReplicated) && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
		got.l, got.err = s.Acquire(ctx, key, ttl)
	}
	if got.err != nil {
		t.Fatalf("after replication resumed: %v", got.err)
	}
	defer got.l.Release(context.Background())
	if got.l.Fence() <= a.Fence() {
		t.Errorf("fence %d after %d", got.l.Fence(), a.Fence())
	}
	rc := redis.NewClient(&redis.Options{Addr: replica.Addr})
	defer rc.Close()
	if tok, _ := lockValue(t, rc, "oncekit:lock:{"+key+"}"); tok != got.l.Token() {
		t.Errorf("the replica has token %q for the key, want the new holder's %q", tok, got.l.Token())
	}
}

// With WithReplicas a completion counts only once a replica has it: a
// Complete whose WAIT the replicas cannot meet fails (ErrNotReplicated),
// and Begin — a duplicate's, or the Guard's check whether an earlier
// Complete stored the result after all — does not return the completed
// record until a replica has it; once replication resumes, Begin replays
// it. (Store calls, not a Guard: what a Guard does after a failed Complete
// depends on timing; what Begin answers does not.)
func TestFailoverCompletionAcknowledged(t *testing.T) {
	g := testenv.StartSentinelGroup(t, 1)
	opts := []redisstore.Option{redisstore.WithReplicas(1, 300*time.Millisecond)}
	s := newStore(t, failoverClient(t, g.SentinelAddrs(), g.Master), opts...)
	dup := newStore(t, failoverClient(t, g.SentinelAddrs(), g.Master), opts...)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const key = "completion-acked"
	c, err := s.Begin(ctx, idemdriver.MustKey(key), "fp", 10*time.Second)
	for deadline := time.Now().Add(10 * time.Second); errors.Is(err, redisstore.ErrNotReplicated) && time.Now().Before(deadline); {
		c, err = s.Begin(ctx, idemdriver.MustKey(key), "fp", 10*time.Second) // a loaded machine's replica may lag past the timeout
	}
	if err != nil || c.State != idemdriver.Acquired {
		t.Fatalf("Begin: %+v %v", c, err)
	}
	g.HoldReplication()
	if err := s.Complete(ctx, c, []byte("placed"), time.Minute); !errors.Is(err, redisstore.ErrNotReplicated) {
		t.Fatalf("Complete with the replicas held = %v, want ErrNotReplicated", err)
	}
	if got, err := dup.Begin(ctx, idemdriver.MustKey(key), "fp", 10*time.Second); err == nil {
		t.Fatalf("Begin while no replica had the completion = %v %q, want ErrNotReplicated", got.State, got.Result)
	} else if !errors.Is(err, redisstore.ErrNotReplicated) {
		t.Fatalf("Begin while no replica had the completion: %v, want ErrNotReplicated", err)
	}
	g.ResumeReplication()
	var got idemdriver.Claim
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if got, err = dup.Begin(ctx, idemdriver.MustKey(key), "fp", 10*time.Second); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil || got.State != idemdriver.Completed || string(got.Result) != "placed" {
		t.Fatalf("Begin after replication resumed: %+v %v, want the completed record replayed", got, err)
	}
}

// With WithReplicas a first attempt that finds the key busy wrote nothing
// and reports the key busy, also on a connection whose last write the
// replicas have not acknowledged (its pipelined WAIT counts too few).
func TestBusyFirstAttemptWithHeldReplication(t *testing.T) {
	g := testenv.StartSentinelGroup(t, 1)
	holder := newStore(t, failoverClient(t, g.SentinelAddrs(), g.Master), redisstore.WithReplicas(1, 300*time.Millisecond))
	one := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: g.Master, SentinelAddrs: g.SentinelAddrs(), PoolSize: 1,
		ContextTimeoutEnabled: true, DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second})
	t.Cleanup(func() { _ = one.Close() })
	other := newStore(t, one, redisstore.WithReplicas(1, 300*time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const key = "busy-first-attempt"
	l, err := holder.TryAcquire(ctx, key, time.Minute)
	for deadline := time.Now().Add(10 * time.Second); errors.Is(err, redisstore.ErrNotReplicated) && time.Now().Before(deadline); {
		l, err = holder.TryAcquire(ctx, key, time.Minute) // a loaded machine's replica may lag past the timeout
	}
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(context.Background())
	g.HoldReplication()
	defer g.ResumeReplication()
	if _, err := other.TryAcquire(ctx, "busy-first-attempt-other", time.Minute); !errors.Is(err, redisstore.ErrNotReplicated) {
		t.Fatalf("a take while replication is held: %v, want ErrNotReplicated", err)
	}
	_, err = other.TryAcquire(ctx, key, time.Minute)
	var busy *lock.BusyError
	if !errors.As(err, &busy) {
		t.Fatalf("TryAcquire of a held key on that connection: %v, want a BusyError", err)
	}
}
