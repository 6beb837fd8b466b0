package locktest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/lock/lockdriver"
)

// Config describes the driver under test.
type Config struct {
	// NewLocker returns a Locker on the store under test. All Lockers
	// returned during one Run must exclude each other: clients of the same
	// server, or the same in-process store. A driver that makes a fresh
	// client per call exercises exclusion across "processes"; it should
	// close the client in t.Cleanup.
	NewLocker func(t *testing.T) lock.Locker

	// RoundTrips, when set, returns the number of requests l (a Locker
	// from NewLocker) made to its server(s) so far, not counting connection
	// set-up (HELLO, CLIENT SETINFO, a session lease). The suite uses it to
	// check that a TryAcquire on a held key costs exactly RoundTripsPerCall.
	RoundTrips func(l lock.Locker) int64

	// RoundTripsPerCall is the number of requests one TryAcquire makes: 1
	// for single-server drivers (the default), N for a driver that fans
	// out to N servers.
	RoundTripsPerCall int64

	// Settle is how long requests of an Acquire may still be landing after
	// it returned (a quorum driver returns once a majority answered). The
	// suite waits this long before it counts round trips, so that the
	// client it measures does not meet the holder's late requests. Default 0.
	Settle time.Duration

	// Unfenced says the driver was configured without fencing (Redlock's
	// WithoutFencing): its leases report Fence() == 0, which the suite then
	// checks instead of the fence order.
	Unfenced bool

	// FenceAtLeast says InspectLock reports a fence at least the holder's
	// rather than exactly it: a driver that reports the last fence the
	// holder's hold reserved (Redis: see lockdriver.LockInfo), or a quorum
	// driver whose nodes each keep their
	// own fence (Redlock: the lease's fence is the highest of the majority
	// it waited for, and a node that answered later may keep a higher one).
	FenceAtLeast bool

	// Reentrant says the driver implements owner reentrancy
	// (lock.WithOwner). When false, the suite checks that acquisitions with
	// an owner fail with lock.ErrReentrancyUnsupported instead.
	Reentrant bool

	// ExpiresAfterDeadline says the driver's local deadline passes well
	// before the store's own expiry (Redlock subtracts a drift allowance:
	// over 20 ms for a 2 s TTL), so that a Release sent as soon as Done
	// closes still finds the key: the suite then requires that Release to
	// succeed, and the second to return nil too.
	ExpiresAfterDeadline bool

	// HolderProcess says the driver's TestMain calls RunHolder, so that the
	// suite can start a holder process and kill and pause it. In-process
	// drivers (memstore) leave it false.
	HolderProcess bool

	// ProcessEnv is added to the holder process's environment (it
	// inherits this process's): what RunHolder's constructor needs to
	// reach the store under test, for a suite that runs beside others on
	// other stores (in parallel, where t.Setenv is not allowed).
	ProcessEnv []string

	// Lag is the extra time the driver may take to notice an expiry (clock
	// drift allowance, the store's expiry resolution). Default 0.
	Lag time.Duration
}

// Run runs the whole suite.
func Run(t *testing.T, cfg Config) {
	t.Helper()
	if cfg.NewLocker == nil {
		t.Fatal("locktest: Config.NewLocker is nil")
	}
	if cfg.RoundTripsPerCall == 0 {
		cfg.RoundTripsPerCall = 1
	}
	s := &suite{cfg: cfg}
	t.Run("Exclusion", s.exclusion)
	t.Run("TryAcquireHeld", s.tryAcquireHeld)
	t.Run("Symmetry", s.symmetry)
	t.Run("NoDeadlock", s.noDeadlock)
	t.Run("LongWaitLiveLease", s.longWaitLiveLease)
	t.Run("FastHandOff", s.fastHandOff)
	t.Run("Cancellation", s.cancellation)
	t.Run("DoneCloses", s.doneCloses)
	t.Run("MutexWatchdog", s.mutexWatchdog)
	t.Run("MutexDoCancelledOnLoss", s.mutexDoCancelledOnLoss)
	t.Run("MutexDo", s.mutexDo)
	t.Run("InvalidInput", s.invalidInput)
	t.Run("ReleaseWithCancelledContext", s.releaseCancelled)
	t.Run("ReleaseTwice", s.releaseTwice)
	t.Run("SealedLeases", s.sealedLeases)
	t.Run("ReleaseTwiceAfterDeadline", s.releaseTwiceAfterDeadline)
	t.Run("Deadline", s.deadline)
	t.Run("NoStarvationByReacquire", s.noStarvation)
	t.Run("AcquireAllNoDeadlock", s.acquireAllNoDeadlock)
	t.Run("AcquireAllPartialFailure", s.acquireAllPartialFailure)
	t.Run("AcquireAllInput", s.acquireAllInput)
	t.Run("Reentrancy", s.reentrancy)
	t.Run("Inspect", s.inspect)
	t.Run("HolderProcessFaults", s.holderProcessFaults)
	t.Run("Closed", s.closed) // last: NewLocker may return one shared Locker
}

type suite struct{ cfg Config }

// key returns a key unique to this test and run.
func key(t *testing.T) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "locktest/" + strings.ReplaceAll(t.Name(), "/", ".") + "/" + hex.EncodeToString(b[:])
}

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

func mustAcquire(t *testing.T, l lock.Locker, key string, ttl time.Duration) lock.Lease {
	t.Helper()
	lease, err := l.Acquire(ctxTimeout(t, 10*time.Second), key, ttl)
	if err != nil {
		t.Fatalf("Acquire(%q, %s): %v", key, ttl, err)
	}
	return lease
}

func assertHeld(t *testing.T, l lock.Locker, key string) {
	t.Helper()
	lease, err := l.TryAcquire(ctxTimeout(t, 5*time.Second), key, 10*time.Second)
	if err == nil {
		_ = lease.Release(context.Background())
		t.Fatalf("TryAcquire(%q) succeeded on a key that should be held", key)
	}
	if !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("TryAcquire(%q) on a held key: %v, want ErrNotAcquired", key, err)
	}
}

func assertFree(t *testing.T, l lock.Locker, key string) {
	t.Helper()
	lease, err := l.TryAcquire(ctxTimeout(t, 5*time.Second), key, 10*time.Second)
	if err != nil {
		t.Fatalf("TryAcquire(%q) on a key that should be free: %v%s", key, err, inspect(t, l, key))
	}
	if err := lease.Release(ctxTimeout(t, 5*time.Second)); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

// inspect describes key's state as l's driver reports it, for a failure
// message.
func inspect(t *testing.T, l lock.Locker, key string) string {
	in, ok := l.(lockdriver.Inspector)
	if !ok {
		return ""
	}
	info, err := in.InspectLock(ctxTimeout(t, 5*time.Second), key)
	if err != nil {
		return fmt.Sprintf(" (InspectLock: %v)", err)
	}
	return fmt.Sprintf(" (InspectLock at %s: %+v)", time.Now().Format("15:04:05.000000"), info)
}

func waitClosed(t *testing.T, ch <-chan struct{}, within time.Duration, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(within):
		t.Fatalf("%s: not closed within %s", what, within)
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// exclusion: 32 goroutines × 100 cycles on one key, spread over several
// Lockers. Inside the critical section a counter is updated by a load, a
// yield and a store (atomic operations, so the race detector stays quiet,
// but not an atomic update: overlapping holders lose increments), and the
// fences seen must be strictly increasing and at most lock.MaxFence (a
// fence gate in a Lua script compares them as doubles).
func (s *suite) exclusion(t *testing.T) {
	const goroutines, cycles = 32, 100
	k := key(t)
	lockers := make([]lock.Locker, 4)
	for i := range lockers {
		lockers[i] = s.cfg.NewLocker(t)
	}
	var (
		counter, inside, overlaps atomic.Int64
		lastFence                 atomic.Uint64
		fenceErrs                 atomic.Int64
		wg                        sync.WaitGroup
		errOnce                   sync.Once
		firstErr                  error
	)
	ctx := ctxTimeout(t, 2*time.Minute)
	for g := range goroutines {
		wg.Go(func() {
			l := lockers[g%len(lockers)]
			for range cycles {
				lease, err := l.Acquire(ctx, k, 10*time.Second)
				if err != nil {
					errOnce.Do(func() { firstErr = err })
					return
				}
				if inside.Add(1) != 1 {
					overlaps.Add(1)
				}
				f := lease.Fence()
				if s.cfg.Unfenced {
					if f != 0 {
						fenceErrs.Add(1)
					}
				} else if f <= lastFence.Load() || f > lock.MaxFence {
					fenceErrs.Add(1)
				}
				lastFence.Store(f)
				v := counter.Load()
				yield()
				counter.Store(v + 1)
				inside.Add(-1)
				if err := lease.Release(ctx); err != nil {
					errOnce.Do(func() { firstErr = err })
					return
				}
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		t.Fatalf("Acquire/Release: %v", firstErr)
	}
	if got := counter.Load(); got != goroutines*cycles {
		t.Errorf("counter = %d, want %d: holders overlapped", got, goroutines*cycles)
	}
	if n := overlaps.Load(); n != 0 {
		t.Errorf("%d acquisitions found another holder inside the critical section", n)
	}
	if n := fenceErrs.Load(); n != 0 {
		t.Errorf("%d fences were not greater than the previous holder's, or above lock.MaxFence (or not 0 when unfenced)", n)
	}
}

func (s *suite) tryAcquireHeld(t *testing.T) {
	k := key(t)
	holder, other := s.cfg.NewLocker(t), s.cfg.NewLocker(t)
	lease := mustAcquire(t, holder, k, 10*time.Second)
	defer lease.Release(context.Background())
	// other is fresh: nothing of its own is in flight while it is measured.
	time.Sleep(s.cfg.Settle)

	var before int64
	if s.cfg.RoundTrips != nil {
		before = s.cfg.RoundTrips(other)
	}
	_, err := other.TryAcquire(ctxTimeout(t, 5*time.Second), k, time.Second)
	time.Sleep(s.cfg.Settle) // a quorum driver answers before every node has
	if s.cfg.RoundTrips != nil {
		if n := s.cfg.RoundTrips(other) - before; n != s.cfg.RoundTripsPerCall {
			t.Errorf("TryAcquire on a held key made %d round trips, want %d", n, s.cfg.RoundTripsPerCall)
		}
	}
	if !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("TryAcquire on a held key: %v, want ErrNotAcquired", err)
	}
	var held *lock.BusyError
	if !errors.As(err, &held) {
		t.Fatalf("TryAcquire on a held key: %T %v, want a *lock.BusyError", err, err)
	}
	if held.TTL <= 0 || held.TTL > 10*time.Second {
		t.Errorf("BusyError.TTL = %s, want in (0, 10s]", held.TTL)
	}
	if held.Key != k {
		t.Errorf("BusyError.Key = %q, want %q", held.Key, k)
	}
}

// symmetry: a lease that ran out and whose key was taken by another cannot
// refresh or release the new holder's lease.
func (s *suite) symmetry(t *testing.T) {
	k := key(t)
	a, b := s.cfg.NewLocker(t), s.cfg.NewLocker(t)
	old := mustAcquire(t, a, k, 100*time.Millisecond)
	waitClosed(t, old.Done(), 2*time.Second+s.cfg.Lag, "expired lease's Done")
	cur := mustAcquire(t, b, k, 10*time.Second)
	defer cur.Release(context.Background())
	if !s.cfg.Unfenced && cur.Fence() <= old.Fence() {
		t.Errorf("new holder's fence %d not greater than the expired one's %d", cur.Fence(), old.Fence())
	}
	if err := old.Refresh(ctxTimeout(t, 5*time.Second), 10*time.Second); !errors.Is(err, lock.ErrLockLost) {
		t.Errorf("Refresh of an expired, re-acquired lease: %v, want ErrLockLost", err)
	}
	if err := old.Release(ctxTimeout(t, 5*time.Second)); !errors.Is(err, lock.ErrLockLost) {
		t.Errorf("Release of an expired, re-acquired lease: %v, want ErrLockLost", err)
	}
	assertHeld(t, a, k)
	if isClosed(cur.Done()) {
		t.Fatal("the new holder's Done closed after the old holder's calls")
	}
	if err := cur.Refresh(ctxTimeout(t, 5*time.Second), 10*time.Second); err != nil {
		t.Errorf("new holder's Refresh: %v", err)
	}
	if err := cur.Release(ctxTimeout(t, 5*time.Second)); err != nil {
		t.Errorf("new holder's Release: %v", err)
	}
}

// noDeadlock: a holder that vanishes without releasing blocks others only
// until its TTL runs out.
func (s *suite) noDeadlock(t *testing.T) {
	k := key(t)
	crashed, next := s.cfg.NewLocker(t), s.cfg.NewLocker(t)
	abandoned := mustAcquire(t, crashed, k, 200*time.Millisecond)
	start := time.Now()
	lease, err := next.Acquire(ctxTimeout(t, 5*time.Second+s.cfg.Lag), k, time.Second)
	if err != nil {
		t.Fatalf("Acquire after the holder's TTL: %v", err)
	}
	defer lease.Release(context.Background())
	if time.Since(start) < 100*time.Millisecond {
		t.Errorf("Acquire returned after %s, before the holder's 200ms TTL could run out", time.Since(start))
	}
	if !s.cfg.Unfenced && lease.Fence() <= abandoned.Fence() {
		t.Errorf("fence %d not greater than the abandoned lease's %d", lease.Fence(), abandoned.Fence())
	}
}

// longWaitLiveLease: a waiter that waited longer than its TTL (the holder
// kept the key alive with a Mutex) gets a live lease, counted from when
// the key became its own, not from when it began waiting: not ended when
// Acquire returns, still live a quarter of the TTL later without a
// Refresh, and its Release succeeds.
func (s *suite) longWaitLiveLease(t *testing.T) {
	const ttl = time.Second
	k := key(t)
	holder, waiter := s.cfg.NewLocker(t), s.cfg.NewLocker(t)
	m, err := lock.NewMutex(holder, lock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	h, err := m.Lock(ctxTimeout(t, 10*time.Second), k)
	if err != nil {
		t.Fatalf("holder: %v", err)
	}
	released := make(chan error, 1)
	go func() {
		time.Sleep(5 * ttl / 2) // the waiter waits longer than its TTL
		released <- h.Release(context.Background())
	}()
	lease, err := waiter.Acquire(ctxTimeout(t, 10*time.Second+s.cfg.Lag), k, ttl)
	got := time.Now()
	if err := <-released; err != nil {
		t.Fatalf("holder's Release: %v", err)
	}
	if err != nil {
		t.Fatalf("Acquire after a wait longer than the TTL: %v", err)
	}
	if isClosed(lease.Done()) {
		t.Fatalf("Acquire returned a lease that had already ended")
	}
	time.Sleep(ttl / 4)
	// (The checks below hold a third of the TTL after Acquire returned; a
	// machine so loaded that the sleep overshot that far cannot tell.)
	if live := time.Since(got) < ttl/3; live && isClosed(lease.Done()) {
		t.Fatalf("the lease ended %s after Acquire returned it, well within its %s TTL", time.Since(got), ttl)
	}
	err = lease.Release(ctxTimeout(t, 5*time.Second))
	if err != nil && time.Since(got) < ttl/3 {
		t.Errorf("Release of the live lease %s after Acquire: %v", time.Since(got), err)
	}
}

// fastHandOff: a waiter is woken by the release, not by the holder's TTL
// nor by a slow poll.
func (s *suite) fastHandOff(t *testing.T) {
	k := key(t)
	holderL, waiterL := s.cfg.NewLocker(t), s.cfg.NewLocker(t)
	holder := mustAcquire(t, holderL, k, 30*time.Second)

	type result struct {
		lease lock.Lease
		at    time.Time
		err   error
	}
	got := make(chan result, 1)
	go func() {
		l, err := waiterL.Acquire(ctxTimeout(t, 20*time.Second), k, 10*time.Second)
		got <- result{l, time.Now(), err}
	}()
	// Let the waiter reach its wait; it must not get the key meanwhile.
	select {
	case r := <-got:
		t.Fatalf("Acquire returned while the key was held: %v", r.err)
	case <-time.After(300 * time.Millisecond):
	}
	released := time.Now()
	if err := holder.Release(ctxTimeout(t, 5*time.Second)); err != nil {
		t.Fatalf("Release: %v", err)
	}
	r := <-got
	if r.err != nil {
		t.Fatalf("waiter's Acquire: %v", r.err)
	}
	defer r.lease.Release(context.Background())
	// (Woken by a poll or the TTL, the waiter would take seconds; 250 ms
	// leaves a loaded machine room for the notice's own round trips.)
	if d := r.at.Sub(released); d > 250*time.Millisecond {
		t.Errorf("hand-off took %s after Release, want under 250ms", d)
	}
}

// cancellation: a waiter whose deadline passes gets both sentinels and
// leaves nothing behind.
func (s *suite) cancellation(t *testing.T) {
	k := key(t)
	holderL, waiterL, thirdL := s.cfg.NewLocker(t), s.cfg.NewLocker(t), s.cfg.NewLocker(t)
	holder := mustAcquire(t, holderL, k, 10*time.Second)
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	lease, err := waiterL.Acquire(ctx, k, 10*time.Second)
	if err == nil {
		_ = lease.Release(context.Background())
		t.Fatal("Acquire on a held key succeeded")
	}
	if !errors.Is(err, lock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire past its deadline: %v, want ErrNotAcquired and context.DeadlineExceeded", err)
	}
	// An already-cancelled context fails at once the same way.
	done, cancelDone := context.WithCancel(t.Context())
	cancelDone()
	if _, err := waiterL.Acquire(done, k, time.Second); !errors.Is(err, lock.ErrNotAcquired) || !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire with a cancelled context: %v, want ErrNotAcquired and context.Canceled", err)
	}
	if err := holder.Release(ctxTimeout(t, 5*time.Second)); err != nil {
		t.Fatalf("Release: %v", err)
	}
	assertFree(t, thirdL, k) // the cancelled waiter left nothing behind
}

func (s *suite) doneCloses(t *testing.T) {
	l := s.cfg.NewLocker(t)
	t.Run("OnRelease", func(t *testing.T) {
		lease := mustAcquire(t, l, key(t), 10*time.Second)
		if isClosed(lease.Done()) {
			t.Fatal("Done closed while held")
		}
		if err := lease.Release(ctxTimeout(t, 5*time.Second)); err != nil {
			t.Fatalf("Release: %v", err)
		}
		if !isClosed(lease.Done()) {
			t.Fatal("Done still open after Release returned")
		}
	})
	t.Run("OnLoss", func(t *testing.T) {
		lease := mustAcquire(t, l, key(t), 150*time.Millisecond)
		waitClosed(t, lease.Done(), 2*time.Second+s.cfg.Lag, "Done of a lease whose TTL ran out")
		if err := lease.Refresh(ctxTimeout(t, 5*time.Second), time.Second); !errors.Is(err, lock.ErrLockLost) {
			t.Errorf("Refresh after loss: %v, want ErrLockLost", err)
		}
	})
}

func (s *suite) mutexWatchdog(t *testing.T) {
	k := key(t)
	// (A refresh every third of a TTL: 300 ms left a loaded run's late
	// refresh of a SQL lease no margin.)
	const ttl = time.Second
	m, err := lock.NewMutex(s.cfg.NewLocker(t), lock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	h, err := m.Lock(ctxTimeout(t, 5*time.Second), k)
	if err != nil {
		t.Fatalf("Lock: %v", err)
	}
	time.Sleep(3*ttl + 100*time.Millisecond) // expiry is the behaviour under test
	assertHeld(t, s.cfg.NewLocker(t), k)
	if err := h.Err(); err != nil {
		t.Fatalf("Held.Err after 3×TTL: %v", err)
	}
	if isClosed(h.Done()) {
		t.Fatal("Done closed after 3×TTL although the watchdog refreshes")
	}
	if err := h.Release(ctxTimeout(t, 5*time.Second)); err != nil {
		t.Fatalf("Release after 3×TTL: %v", err)
	}
	if !isClosed(h.Done()) {
		t.Fatal("Done still open after Release")
	}
	if err := h.Err(); err != nil {
		t.Fatalf("Held.Err after a clean Release: %v", err)
	}
	if isClosed(h.Lost()) {
		t.Fatal("Lost closed by a clean Release")
	}
	assertFree(t, s.cfg.NewLocker(t), k)
}

// mutexDoCancelledOnLoss cuts the holder off from the store (its refreshes
// hang until they time out, as in a network partition) and checks that Do's
// context is cancelled with ErrLockLost once the TTL runs out, and that
// another client can then take the key.
func (s *suite) mutexDoCancelledOnLoss(t *testing.T) {
	k := key(t)
	const ttl = 200 * time.Millisecond
	m, err := lock.NewMutex(partitioned{s.cfg.NewLocker(t)}, lock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	var cause error
	err = m.Do(ctxTimeout(t, 10*time.Second), k, func(ctx context.Context, _ lock.Lease) error {
		select {
		case <-ctx.Done():
			cause = context.Cause(ctx)
			return ctx.Err()
		case <-time.After(5*time.Second + s.cfg.Lag):
			return errors.New("fn's context was not cancelled after the lease was lost")
		}
	})
	if !errors.Is(cause, lock.ErrLockLost) {
		t.Errorf("cause of fn's cancellation = %v, want ErrLockLost", cause)
	}
	if !errors.Is(err, lock.ErrLockLost) {
		t.Errorf("Do = %v, want ErrLockLost", err)
	}
	lease := mustAcquire(t, s.cfg.NewLocker(t), k, time.Second)
	_ = lease.Release(context.Background())
}

func (s *suite) mutexDo(t *testing.T) {
	k := key(t)
	m, err := lock.NewMutex(s.cfg.NewLocker(t), lock.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	other := s.cfg.NewLocker(t)
	want := errors.New("fn failed")
	var (
		held     string    // the lease's token, to tell its hold from others
		returned time.Time // when Do returned, against InspectLock's time
	)
	defer func() {
		if t.Failed() {
			t.Logf("the Mutex's lease had token %s; Do returned at %s", held, returned.Format("15:04:05.000000"))
		}
	}()
	err = m.Do(ctxTimeout(t, 5*time.Second), k, func(ctx context.Context, l lock.Lease) error {
		held = lockdriver.TokenPrefix(l.Token())
		if l.Key() != k || (l.Fence() == 0) != s.cfg.Unfenced {
			t.Errorf("lease in Do: key %q fence %d", l.Key(), l.Fence())
		}
		assertHeld(t, other, k)
		return want
	})
	returned = time.Now()
	if err != want {
		t.Errorf("Do = %v, want fn's error alone", err)
	}
	assertFree(t, other, k)
}

func (s *suite) invalidInput(t *testing.T) {
	l := s.cfg.NewLocker(t)
	ctx := ctxTimeout(t, 5*time.Second)
	ok := key(t)
	tests := []struct {
		name string
		key  string
		ttl  time.Duration
		want error
	}{
		{"EmptyKey", "", time.Second, lock.ErrInvalidKey},
		{"KeyTooLong", strings.Repeat("k", lock.MaxKeyLen+1), time.Second, lock.ErrInvalidKey},
		{"ZeroTTL", ok, 0, lock.ErrInvalidTTL},
		{"NegativeTTL", ok, -time.Second, lock.ErrInvalidTTL},
		{"SubMillisecondTTL", ok, lock.MinTTL - 1, lock.ErrInvalidTTL},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := l.TryAcquire(ctx, tc.key, tc.ttl); !errors.Is(err, tc.want) {
				t.Errorf("TryAcquire: %v, want %v", err, tc.want)
			}
			if _, err := l.Acquire(ctx, tc.key, tc.ttl); !errors.Is(err, tc.want) {
				t.Errorf("Acquire: %v, want %v", err, tc.want)
			}
		})
	}
	t.Run("LongestKey", func(t *testing.T) {
		k := key(t)
		k += strings.Repeat("x", lock.MaxKeyLen-len(k))
		lease := mustAcquire(t, l, k, 10*time.Second)
		if err := lease.Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
	})
	t.Run("RefreshTTL", func(t *testing.T) {
		lease := mustAcquire(t, l, key(t), 10*time.Second)
		defer lease.Release(context.Background())
		if err := lease.Refresh(ctx, 0); !errors.Is(err, lock.ErrInvalidTTL) {
			t.Errorf("Refresh(0): %v, want ErrInvalidTTL", err)
		}
	})
	// Nothing was left behind by the rejected calls.
	assertFree(t, s.cfg.NewLocker(t), ok)
}

func (s *suite) releaseCancelled(t *testing.T) {
	k := key(t)
	l := s.cfg.NewLocker(t)
	lease := mustAcquire(t, l, k, 30*time.Second)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := lease.Release(ctx); err != nil {
		t.Fatalf("Release with a cancelled context: %v", err)
	}
	assertFree(t, s.cfg.NewLocker(t), k)
}

// noStarvation: processes that release a key and at once ask for it
// again, in tight loops, must not keep it from a process that waits: the
// waiter gets the key within a fraction of a second, every time (a release
// wakes the first waiter and the key is kept for it; without that, one
// re-asking process could take the key back before any woken waiter, for
// as long as the recheck interval).
func (s *suite) noStarvation(t *testing.T) {
	k := key(t)
	ctx := ctxTimeout(t, 60*time.Second)
	var stop atomic.Bool
	var wg sync.WaitGroup
	for range 6 {
		hog := s.cfg.NewLocker(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				l, err := hog.Acquire(ctx, k, 5*time.Second)
				if err != nil {
					return
				}
				_ = l.Release(ctx)
			}
		}()
	}
	defer func() { stop.Store(true); wg.Wait() }()
	waiter := s.cfg.NewLocker(t)
	time.Sleep(100 * time.Millisecond)
	var worst time.Duration
	for i := range 10 {
		start := time.Now()
		l, err := waiter.Acquire(ctx, k, 5*time.Second)
		if err != nil {
			t.Fatalf("waiter #%d: %v", i, err)
		}
		worst = max(worst, time.Since(start))
		_ = l.Release(ctx)
		time.Sleep(20 * time.Millisecond)
	}
	limit := 700*time.Millisecond + s.cfg.Lag
	if raceEnabled {
		limit *= 3
	}
	if worst > limit {
		t.Errorf("a waiter waited up to %s for a key six processes release and take back in loops (limit %s)",
			worst.Round(time.Millisecond), limit)
	}
}

// deadline: a lease exposes its validity deadline: within its TTL from
// now, moved by Refresh, and the zero time once released.
func (s *suite) deadline(t *testing.T) {
	const ttl = 5 * time.Second
	before := time.Now()
	lease := mustAcquire(t, s.cfg.NewLocker(t), key(t), ttl)
	d := lease.Deadline()
	if d.Before(before) || d.After(time.Now().Add(ttl+s.cfg.Lag)) {
		t.Fatalf("Deadline %s, want within the TTL of the acquisition (%s .. %s)", d, before, time.Now().Add(ttl))
	}
	time.Sleep(20 * time.Millisecond)
	if err := lease.Refresh(ctxTimeout(t, 5*time.Second), 2*ttl); err != nil {
		t.Fatal(err)
	}
	if nd := lease.Deadline(); !nd.After(d) {
		t.Errorf("Deadline after a Refresh to %s: %s, not later than %s", 2*ttl, nd, d)
	}
	if err := lease.Release(ctxTimeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if nd := lease.Deadline(); !nd.IsZero() {
		t.Errorf("Deadline of a released lease = %s, want the zero time", nd)
	}
}

// releaseTwiceAfterDeadline: a lease whose local deadline passed (Done
// closed) is released. If that Release succeeded — the key still lived in
// the store — a second Release returns nil, as after any successful
// Release; if it found the key gone, ErrLockLost.
func (s *suite) releaseTwiceAfterDeadline(t *testing.T) {
	ttl := 2 * time.Second
	if s.cfg.ExpiresAfterDeadline {
		// The store's expiry comes only the drift allowance after the local
		// deadline (Redlock: 1 % + 2 ms, 22 ms of 2 s), which a loaded
		// machine can spend before the Release reaches the servers: 5 s
		// leaves 52 ms.
		ttl = 5 * time.Second
	}
	lease := mustAcquire(t, s.cfg.NewLocker(t), key(t), ttl)
	select {
	case <-lease.Done():
	case <-time.After(ttl + s.cfg.Lag + 5*time.Second):
		t.Fatal("Done did not close at the lease's deadline")
	}
	first := lease.Release(ctxTimeout(t, 5*time.Second))
	if first != nil && !errors.Is(first, lock.ErrLockLost) {
		t.Fatalf("Release after the deadline: %v, want nil or ErrLockLost", first)
	}
	if s.cfg.ExpiresAfterDeadline && first != nil {
		t.Fatalf("Release right after the local deadline: %v; the key still lived in the store", first)
	}
	second := lease.Release(ctxTimeout(t, 5*time.Second))
	switch {
	case first == nil && second != nil:
		t.Fatalf("second Release after a successful one: %v, want nil", second)
	case first != nil && second != nil && !errors.Is(second, lock.ErrLockLost):
		t.Fatalf("second Release: %v, want nil or ErrLockLost", second)
	}
}

func (s *suite) releaseTwice(t *testing.T) {
	k := key(t)
	lease := mustAcquire(t, s.cfg.NewLocker(t), k, 30*time.Second)
	for i := range 2 {
		if err := lease.Release(ctxTimeout(t, 5*time.Second)); err != nil {
			t.Fatalf("Release #%d: %v", i+1, err)
		}
	}
}

// sealedLeases: what TryAcquire, Acquire and AcquireAll return has
// exactly lock.Lease's methods, so that no caller can reach the driver's
// machinery (ending a lease without releasing it, refreshing it behind
// the watchdog) through a type assertion.
func (s *suite) sealedLeases(t *testing.T) {
	want := map[string]bool{}
	lt := reflect.TypeFor[lock.Lease]()
	for i := range lt.NumMethod() {
		want[lt.Method(i).Name] = true
	}
	check := func(how string, l lock.Lease) {
		t.Helper()
		typ := reflect.TypeOf(l)
		for i := range typ.NumMethod() {
			if m := typ.Method(i).Name; !want[m] {
				t.Errorf("the lease %s returns (%s) has method %s, which lock.Lease does not", how, typ, m)
			}
		}
		if err := l.Release(ctxTimeout(t, 5*time.Second)); err != nil {
			t.Errorf("Release of the lease %s returned: %v", how, err)
		}
	}
	l := s.cfg.NewLocker(t)
	k := key(t)
	tl, err := l.TryAcquire(ctxTimeout(t, 5*time.Second), k+"/try", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	check("TryAcquire", tl)
	check("Acquire", mustAcquire(t, l, k+"/acquire", 10*time.Second))
	if ml, ok := l.(lockdriver.MultiLocker); ok {
		ls, err := ml.AcquireAll(ctxTimeout(t, 5*time.Second), []string{k + "/a", k + "/b"}, 10*time.Second)
		if errors.Is(err, errors.ErrUnsupported) {
			return // (keys in several Cluster slots; lock.AcquireAll then takes them one by one)
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range ls {
			check("AcquireAll", l)
		}
	}
}

// acquireAllNoDeadlock: two callers take {A,B} and {B,A} at once, over and
// over; canonical ordering means neither ever waits for the other in a
// cycle, and each key stays exclusive.
func (s *suite) acquireAllNoDeadlock(t *testing.T) {
	a, b := key(t)+"/a", key(t)+"/b"
	var inside [2]atomic.Int64
	var overlaps atomic.Int64
	var wg sync.WaitGroup
	ctx := ctxTimeout(t, time.Minute)
	errs := make(chan error, 2)
	for _, order := range [][]string{{a, b}, {b, a}} {
		l := s.cfg.NewLocker(t)
		wg.Go(func() {
			for range 25 {
				m, err := lock.AcquireAll(ctx, l, order, 10*time.Second)
				if err != nil {
					errs <- err
					return
				}
				for j := range inside {
					if inside[j].Add(1) != 1 {
						overlaps.Add(1)
					}
				}
				yield()
				for j := range inside {
					inside[j].Add(-1)
				}
				if err := m.Release(ctx); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("AcquireAll/Release: %v", err)
	}
	if overlaps.Load() != 0 {
		t.Errorf("%d times two callers held the same key", overlaps.Load())
	}
}

// acquireAllPartialFailure: when one key cannot be taken, the keys taken
// before it are released.
func (s *suite) acquireAllPartialFailure(t *testing.T) {
	a, b := key(t)+"/a", key(t)+"/b" // a sorts first and is free; b is held
	holder := mustAcquire(t, s.cfg.NewLocker(t), b, 10*time.Second)
	defer holder.Release(context.Background())
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	m, err := lock.AcquireAll(ctx, s.cfg.NewLocker(t), []string{b, a}, 10*time.Second)
	if err == nil {
		m.Release(context.Background())
		t.Fatal("AcquireAll succeeded although one key is held")
	}
	if !errors.Is(err, lock.ErrNotAcquired) {
		t.Errorf("AcquireAll: %v, want ErrNotAcquired", err)
	}
	assertFree(t, s.cfg.NewLocker(t), a)
}

func (s *suite) acquireAllInput(t *testing.T) {
	l := s.cfg.NewLocker(t)
	ctx := ctxTimeout(t, 5*time.Second)
	if _, err := lock.AcquireAll(ctx, l, nil, time.Second); !errors.Is(err, lock.ErrInvalidKey) {
		t.Errorf("AcquireAll(no keys): %v, want ErrInvalidKey", err)
	}
	if _, err := lock.AcquireAll(ctx, l, []string{key(t), ""}, time.Second); !errors.Is(err, lock.ErrInvalidKey) {
		t.Errorf("AcquireAll with an empty key: %v, want ErrInvalidKey", err)
	}
	k := key(t)
	m, err := lock.AcquireAll(ctx, l, []string{k, k, k}, 10*time.Second)
	if err != nil {
		t.Fatalf("AcquireAll with duplicates: %v", err)
	}
	if got := m.Keys(); len(got) != 1 || got[0] != k {
		t.Errorf("Keys() = %q, want [%q]", got, k)
	}
	if m.Fence(k) == 0 && !s.cfg.Unfenced {
		t.Error("Fence of a held key is 0")
	}
	assertHeld(t, s.cfg.NewLocker(t), k)
	if err := m.Refresh(ctx, 10*time.Second); err != nil {
		t.Errorf("Refresh: %v", err)
	}
	if err := m.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if !isClosed(m.Done()) {
		waitClosed(t, m.Done(), time.Second, "MultiLease.Done after Release")
	}
	assertFree(t, s.cfg.NewLocker(t), k)
}

func (s *suite) reentrancy(t *testing.T) {
	if !s.cfg.Reentrant {
		l := s.cfg.NewLocker(t)
		ctx := lock.WithOwner(ctxTimeout(t, 5*time.Second), "worker-1")
		k := key(t)
		if _, err := l.TryAcquire(ctx, k, time.Second); !errors.Is(err, lock.ErrReentrancyUnsupported) {
			t.Errorf("TryAcquire with an owner: %v, want ErrReentrancyUnsupported", err)
		}
		if _, err := l.Acquire(ctx, k, time.Second); !errors.Is(err, lock.ErrReentrancyUnsupported) {
			t.Errorf("Acquire with an owner: %v, want ErrReentrancyUnsupported", err)
		}
		assertFree(t, s.cfg.NewLocker(t), k)
		return
	}
	t.Run("SameOwnerReenters", s.sameOwnerReenters)
	t.Run("WaitsWithoutOwner", func(t *testing.T) {
		k := key(t)
		l := s.cfg.NewLocker(t)
		held := mustAcquire(t, l, k, 10*time.Second)
		defer held.Release(context.Background())
		ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
		defer cancel()
		if _, err := l.Acquire(ctx, k, time.Second); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("second ownerless Acquire: %v, want to wait until the deadline", err)
		}
	})
	t.Run("LossEndsAllHolds", func(t *testing.T) {
		k := key(t)
		l := s.cfg.NewLocker(t)
		ctx := lock.WithOwner(ctxTimeout(t, 10*time.Second), "job-9")
		a := mustAcquireCtx(t, l, ctx, k, 150*time.Millisecond)
		b := mustAcquireCtx(t, l, ctx, k, 150*time.Millisecond)
		waitClosed(t, a.Done(), 2*time.Second+s.cfg.Lag, "first hold's Done after the TTL")
		waitClosed(t, b.Done(), 2*time.Second+s.cfg.Lag, "second hold's Done after the TTL")
		next := mustAcquire(t, s.cfg.NewLocker(t), k, 10*time.Second)
		defer next.Release(context.Background())
		for _, h := range []lock.Lease{a, b} {
			if err := h.Release(ctxTimeout(t, 5*time.Second)); !errors.Is(err, lock.ErrLockLost) {
				t.Errorf("Release of a lost hold: %v, want ErrLockLost", err)
			}
		}
		assertHeld(t, s.cfg.NewLocker(t), k)
	})
	t.Run("ShortHoldKeepsKey", s.shortHoldKeepsKey)
	t.Run("InvalidOwner", func(t *testing.T) {
		ctx := lock.WithOwner(ctxTimeout(t, 5*time.Second), strings.Repeat("o", lock.MaxOwnerLen+1))
		if _, err := s.cfg.NewLocker(t).Acquire(ctx, key(t), time.Second); !errors.Is(err, lock.ErrInvalidOwner) {
			t.Errorf("Acquire with an oversized owner: %v, want ErrInvalidOwner", err)
		}
	})
}

// sameOwnerReenters: an owner re-enters a key it holds, through any
// client, with the holder's fence and token; the key is free after the
// last hold's Release.
func (s *suite) sameOwnerReenters(t *testing.T) {
	k := key(t)
	l := s.cfg.NewLocker(t)
	ctx := lock.WithOwner(ctxTimeout(t, 5*time.Second), "job-7")
	first := mustAcquire(t, l, k, 10*time.Second)
	_ = first.Release(context.Background()) // a plain (ownerless) lease first, to separate fences
	a, err := l.Acquire(ctx, k, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	b, err := l.TryAcquire(ctx, k, 10*time.Second) // at once, from a held key
	if err != nil {
		t.Fatalf("TryAcquire by the same owner: %v", err)
	}
	c, err := s.cfg.NewLocker(t).Acquire(ctx, k, 10*time.Second) // another client, same owner
	if err != nil {
		t.Fatalf("Acquire by the same owner through another client: %v", err)
	}
	for _, l := range []lock.Lease{b, c} {
		if l.Fence() != a.Fence() || l.Token() != a.Token() {
			t.Errorf("re-entry: fence %d token %q, want the holder's %d %q", l.Fence(), l.Token(), a.Fence(), a.Token())
		}
	}
	// Another owner, and no owner, wait.
	other := lock.WithOwner(ctxTimeout(t, 5*time.Second), "job-8")
	if _, err := s.cfg.NewLocker(t).TryAcquire(other, k, time.Second); !errors.Is(err, lock.ErrNotAcquired) {
		t.Errorf("TryAcquire by another owner: %v, want ErrNotAcquired", err)
	}
	assertHeld(t, s.cfg.NewLocker(t), k)
	// Each Release gives one hold back; the key is freed with the last.
	for i, h := range []lock.Lease{c, a} {
		if err := h.Release(ctxTimeout(t, 5*time.Second)); err != nil {
			t.Fatalf("Release %d: %v", i+1, err)
		}
		if !isClosed(h.Done()) {
			t.Errorf("Done of a released hold is open")
		}
		assertHeld(t, s.cfg.NewLocker(t), k)
	}
	if err := b.Release(ctxTimeout(t, 5*time.Second)); err != nil {
		t.Fatalf("last Release: %v", err)
	}
	assertFree(t, s.cfg.NewLocker(t), k)
}

// shortHoldKeepsKey: an owner's second, shorter hold does not shorten the
// key's expiry below the first's.
func (s *suite) shortHoldKeepsKey(t *testing.T) {
	// An owner's second hold with a shorter TTL, refreshed, must not
	// shorten the key's expiry below the first hold's: while the first
	// lease's Done is open, nobody else may take the key.
	k := key(t)
	l := s.cfg.NewLocker(t)
	ctx := lock.WithOwner(ctxTimeout(t, 10*time.Second), "job-10")
	// (A short hold of a second: one of 200 ms ran out on a loaded
	// machine before its Refresh was sent.)
	long := mustAcquireCtx(t, l, ctx, k, 6*time.Second)
	short := mustAcquireCtx(t, l, ctx, k, time.Second)
	if err := short.Refresh(ctxTimeout(t, 5*time.Second), time.Second); err != nil {
		t.Fatalf("Refresh of the short hold: %v", err)
	}
	time.Sleep(2500*time.Millisecond + s.cfg.Lag) // the short hold's TTL is long past
	if isClosed(long.Done()) {
		t.Fatal("the long hold's Done closed while its TTL runs")
	}
	assertHeld(t, s.cfg.NewLocker(t), k)
	_ = short.Release(context.Background())
	if err := long.Release(ctxTimeout(t, 5*time.Second)); err != nil {
		t.Errorf("Release of the long hold: %v", err)
	}
}

func mustAcquireCtx(t *testing.T, l lock.Locker, ctx context.Context, key string, ttl time.Duration) lock.Lease {
	t.Helper()
	lease, err := l.Acquire(ctx, key, ttl)
	if err != nil {
		t.Fatalf("Acquire(%q, %s): %v", key, ttl, err)
	}
	return lease
}

// inspect checks lockdriver.Inspector, which every oncekit driver implements: the
// holder's token prefix, fence and TTL, and a forced release that another
// client then sees as free while the old holder learns it lost the key.
func (s *suite) inspect(t *testing.T) {
	l := s.cfg.NewLocker(t)
	in, ok := l.(lockdriver.Inspector)
	if !ok {
		t.Fatalf("%T does not implement lockdriver.Inspector", l)
	}
	ctx := ctxTimeout(t, 10*time.Second)
	k := key(t)
	if _, err := in.InspectLock(ctx, ""); !errors.Is(err, lock.ErrInvalidKey) {
		t.Errorf("InspectLock(\"\"): %v, want ErrInvalidKey", err)
	}
	info, err := in.InspectLock(ctx, k)
	if err != nil || info.Held || info.Key != k {
		t.Fatalf("InspectLock on a free key = %+v, %v", info, err)
	}
	const ttl = 5 * time.Second
	held := mustAcquire(t, l, k, ttl)
	info, err = in.InspectLock(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	fenceOK := info.Fence == held.Fence() || (s.cfg.FenceAtLeast && info.Fence > held.Fence())
	if !info.Held || info.Token != lockdriver.TokenPrefix(held.Token()) || !fenceOK ||
		info.TTL <= 0 || info.TTL > ttl+s.cfg.Lag || info.Holds != 1 || info.Owner != "" {
		t.Errorf("InspectLock on a held key = %+v; want held by %s, fence %d, TTL in (0, %v]",
			info, lockdriver.TokenPrefix(held.Token()), held.Fence(), ttl)
	}

	other := s.cfg.NewLocker(t).(lockdriver.Inspector)
	forced, err := other.ForceRelease(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	if !forced.Held || forced.Token != lockdriver.TokenPrefix(held.Token()) {
		t.Errorf("ForceRelease reported %+v, want the holder %s", forced, lockdriver.TokenPrefix(held.Token()))
	}
	time.Sleep(s.cfg.Settle)
	next, err := other.(lock.Locker).TryAcquire(ctx, k, ttl)
	if err != nil {
		t.Fatalf("TryAcquire after ForceRelease: %v", err)
	}
	if !s.cfg.Unfenced && next.Fence() <= held.Fence() {
		t.Errorf("fence after ForceRelease %d, not above the old holder's %d", next.Fence(), held.Fence())
	}
	if err := held.Refresh(ctx, ttl); !errors.Is(err, lock.ErrLockLost) {
		t.Errorf("the forced-out holder's Refresh: %v, want ErrLockLost", err)
	}
	if err := next.Release(ctx); err != nil {
		t.Error(err)
	}
	if again, err := other.ForceRelease(ctx, k); err != nil || again.Held {
		t.Errorf("ForceRelease of a free key = %+v, %v; want not held", again, err)
	}
}

// closed: after Close, a Locker refuses TryAcquire and Acquire with an
// error matching lock.ErrClosed, and an Acquire that was waiting for a key
// when Close was called gives up with it (within seconds, not at its
// context's end). A lease taken before Close can still be released.
func (s *suite) closed(t *testing.T) {
	l := s.cfg.NewLocker(t)
	c, ok := l.(io.Closer)
	if !ok {
		t.Fatalf("%T has no Close method: every driver closes alike", l)
	}
	k := key(t)
	holder := s.cfg.NewLocker(t)
	held, err := holder.Acquire(ctxTimeout(t, 10*time.Second), k, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() {
		wl, err := l.Acquire(ctxTimeout(t, time.Minute), k, time.Minute)
		if err == nil {
			_ = wl.Release(context.Background())
		}
		waited <- err
	}()
	time.Sleep(200 * time.Millisecond) // (the waiter is queued by now, or about to be)
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case err := <-waited:
		if !errors.Is(err, lock.ErrClosed) {
			t.Errorf("an Acquire waiting when its Locker was closed: %v, want lock.ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("an Acquire waiting when its Locker was closed still waits 10 s later")
	}
	if _, err := l.TryAcquire(ctxTimeout(t, 10*time.Second), key(t), time.Minute); !errors.Is(err, lock.ErrClosed) {
		t.Errorf("TryAcquire after Close: %v, want lock.ErrClosed", err)
	}
	if _, err := l.Acquire(ctxTimeout(t, 10*time.Second), key(t), time.Minute); !errors.Is(err, lock.ErrClosed) {
		t.Errorf("Acquire after Close: %v, want lock.ErrClosed", err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("a second Close: %v, want nil", err)
	}
	if err := held.Release(ctxTimeout(t, 10*time.Second)); err != nil && !errors.Is(err, lock.ErrClosed) {
		t.Errorf("Release of a lease taken before its Locker was closed: %v", err)
	}
}
