package testenv

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/observe"
)

// Events is an observe.Observer that keeps the events it is given.
type Events struct {
	observe.Func
	mu  sync.Mutex
	evs []observe.Event
}

// NewEvents returns an empty Events.
func NewEvents() *Events {
	e := &Events{}
	e.Func = func(_ context.Context, ev observe.Event) {
		e.mu.Lock()
		e.evs = append(e.evs, ev)
		e.mu.Unlock()
	}
	return e
}

// Of returns the events of op so far.
func (e *Events) Of(op observe.Op) []observe.Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []observe.Event
	for _, ev := range e.evs {
		if ev.Op == op {
			out = append(out, ev)
		}
	}
	return out
}

// AcquireRelease takes key from l and releases it, returning the lease:
// a Store that does this twice in a row has the key hot, and keeps its
// second Release's hold (the drivers' WithLinger).
func AcquireRelease(ctx context.Context, t testing.TB, l lock.Locker, key string, ttl time.Duration) lock.Lease {
	t.Helper()
	lease, err := l.Acquire(ctx, key, ttl)
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	return lease
}

// KeptCycles runs n more AcquireRelease cycles of key on l after last, a
// lease whose hold l kept, and checks that each was served by that hold:
// the same token and the next fence (0 when the driver is unfenced). It
// returns the last lease.
func KeptCycles(ctx context.Context, t testing.TB, l lock.Locker, key string, last lock.Lease, n int, fenced bool) lock.Lease {
	t.Helper()
	for i := range n {
		lease := AcquireRelease(ctx, t, l, key, 10*time.Second)
		want := last.Fence() + 1
		if !fenced {
			want = 0
		}
		if lease.Token() != last.Token() || lease.Fence() != want {
			t.Errorf("kept lease %d: token %q fence %d after token %q fence %d; want the same hold, fence %d",
				i, lease.Token(), lease.Fence(), last.Token(), last.Fence(), want)
		}
		last = lease
	}
	return last
}

// FromKept makes key hot on l (two AcquireRelease cycles: the second
// Release keeps the hold) and returns the lease l's next Acquire takes
// from the kept hold.
func FromKept(ctx context.Context, t testing.TB, l lock.Locker, key string, ttl time.Duration) lock.Lease {
	t.Helper()
	AcquireRelease(ctx, t, l, key, ttl)
	AcquireRelease(ctx, t, l, key, ttl)
	lease, err := l.Acquire(ctx, key, ttl)
	if err != nil {
		t.Fatal(err)
	}
	return lease
}

// AcquireLater starts l.Acquire(ctx, key, ttl) on a goroutine of its own
// and returns where its lease arrives: nil after an error, which fails t.
func AcquireLater(ctx context.Context, t testing.TB, l lock.Locker, key string, ttl time.Duration) <-chan lock.Lease {
	got := make(chan lock.Lease, 1)
	go func() {
		lease, err := l.Acquire(ctx, key, ttl)
		if err != nil {
			t.Error(err)
		}
		got <- lease
	}()
	return got
}

// RefreshAcrossRelease sends a Refresh of l, releases l while that Refresh
// is on its way (its client must hold it back: SlowScript, or an etcd
// interceptor), and checks that the Refresh then reports lock.ErrLockLost.
func RefreshAcrossRelease(ctx context.Context, t testing.TB, l lock.Lease) {
	t.Helper()
	refreshed := make(chan error, 1)
	go func() { refreshed <- l.Refresh(ctx, 10*time.Second) }()
	time.Sleep(100 * time.Millisecond) // the refresh is on its way
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-refreshed; !errors.Is(err, lock.ErrLockLost) {
		t.Errorf("Refresh across the Release: %v, want ErrLockLost", err)
	}
}

// CheckHandOff has waiter wait for a key holder holds, releases it, and
// checks that waiter's driver reported one hand-off on events with path
// want, the waiter's fence and a plausible latency.
//
// The waiter is given 100 ms to queue before the release. On a loaded
// machine its first attempt (or its subscription) can come after the
// release, and it then takes the free key without a hand-off — correct,
// but not what is being tested; such a round is run again with a new key,
// up to three times. A driver that never reports a hand-off fails every
// round.
func CheckHandOff(t *testing.T, holder, waiter lock.Locker, events *Events, want observe.Outcome) {
	t.Helper()
	for round := 1; ; round++ {
		key := fmt.Sprintf("handoff-%s-%d", t.Name(), round)
		evs, next := handOffRound(t, holder, waiter, events, key)
		if next == nil {
			return
		}
		if len(evs) == 0 && round < 3 {
			t.Logf("round %d: the waiter took the key without waiting; again", round)
			continue
		}
		if len(evs) != 1 {
			t.Fatalf("%d hand-off events, want 1: %+v", len(evs), evs)
		}
		ev := evs[0]
		if ev.Outcome != want || ev.Fence != next.Fence() || ev.Duration <= 0 || ev.Duration > 5*time.Second || ev.Driver == "" {
			t.Errorf("hand-off event %+v; want path %s, fence %d", ev, want, next.Fence())
		}
		return
	}
}

// handOffRound runs one hand-off of key from holder to waiter and returns
// the hand-off events reported for key and the waiter's lease, released
// when t ends (nil after an error, which fails t).
func handOffRound(t *testing.T, holder, waiter lock.Locker, events *Events, key string) ([]observe.Event, lock.Lease) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	held, err := holder.Acquire(ctx, key, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	got := AcquireLater(ctx, t, waiter, key, 10*time.Second)
	time.Sleep(100 * time.Millisecond) // the waiter is queued and subscribed
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	next := <-got
	if next == nil {
		return nil, nil
	}
	t.Cleanup(func() { _ = next.Release(context.Background()) })
	var evs []observe.Event
	for _, ev := range events.Of(observe.LockHandOff) {
		if ev.Key == key {
			evs = append(evs, ev)
		}
	}
	return evs, next
}

// HeatUp takes and releases key on l until l keeps it after a Release
// (kept reports whether it did), and returns that last lease. A key is hot
// when its Store asks for it again within a few milliseconds of releasing
// it; on a loaded machine (the race detector, a busy CI) one gap can be
// longer, so it tries up to ten times before failing.
func HeatUp(ctx context.Context, t testing.TB, l lock.Locker, key string, ttl time.Duration, kept func(lock.Lease) bool) lock.Lease {
	t.Helper()
	for range 10 {
		if last := AcquireRelease(ctx, t, l, key, ttl); kept(last) {
			return last
		}
	}
	t.Fatalf("key %q was never kept after its Release in ten quick cycles", key)
	return nil
}
