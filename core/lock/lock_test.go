package lock_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/lock/lockdriver"
	"github.com/oncekit/oncekit/core/observe"
	"github.com/oncekit/oncekit/storage/memstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestValidate(t *testing.T) {
	tests := []struct {
		key  string
		ttl  time.Duration
		want error
	}{
		{"k", time.Millisecond, nil},
		{strings.Repeat("k", lock.MaxKeyLen), time.Hour, nil},
		{"", time.Second, lock.ErrInvalidKey},
		{strings.Repeat("k", lock.MaxKeyLen+1), time.Second, lock.ErrInvalidKey},
		{"k", 0, lock.ErrInvalidTTL},
		{"k", time.Millisecond - 1, lock.ErrInvalidTTL},
		{"k", -time.Hour, lock.ErrInvalidTTL},
	}
	for _, tc := range tests {
		err := lockdriver.Validate(tc.key, tc.ttl)
		if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
			t.Errorf("Validate(%d-byte key, %s) = %v, want %v", len(tc.key), tc.ttl, err, tc.want)
		}
	}
}

func TestFenceGate(t *testing.T) {
	var g lock.FenceGate
	if g.Current("r") != 0 {
		t.Fatal("zero FenceGate has a fence")
	}
	steps := []struct {
		res   string
		fence uint64
		stale bool
	}{
		{"r", 5, false}, {"r", 5, false}, {"r", 4, true}, {"r", 9, false},
		{"r", 6, true}, {"other", 1, false},
	}
	for _, st := range steps {
		err := g.Admit(st.res, st.fence)
		var se *lock.StaleFenceError
		if st.stale != errors.Is(err, lock.ErrStaleFence) || st.stale != errors.As(err, &se) {
			t.Errorf("Admit(%q, %d) = %v, stale=%v", st.res, st.fence, err, st.stale)
		}
	}
	if g.Current("r") != 9 || g.Current("other") != 1 {
		t.Errorf("Current = %d, %d; want 9, 1", g.Current("r"), g.Current("other"))
	}
}

func TestBusyErrorMessage(t *testing.T) {
	e := &lock.BusyError{Key: "k", TTL: -1}
	if !strings.Contains(e.Error(), `"k" is held`) {
		t.Errorf("unexpected message %q", e.Error())
	}
}

func TestNewMutexValidates(t *testing.T) {
	if _, err := lock.NewMutex(nil); err == nil {
		t.Error("NewMutex(nil): no error")
	}
	if _, err := lock.NewMutex(memstore.New(), lock.WithTTL(0)); !errors.Is(err, lock.ErrInvalidTTL) {
		t.Errorf("NewMutex with TTL 0: %v, want ErrInvalidTTL", err)
	}
}

func TestMutexObserver(t *testing.T) {
	var (
		mu     sync.Mutex
		events []string
	)
	obs := observe.Func(func(_ context.Context, ev observe.Event) {
		mu.Lock()
		events = append(events, string(ev.Op)+":"+string(ev.Outcome))
		mu.Unlock()
	})
	m, err := lock.NewMutex(memstore.New(), lock.WithTTL(time.Second), lock.WithObserver(obs))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	h, err := m.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.TryLock(ctx, "k"); !errors.Is(err, lock.ErrNotAcquired) {
		t.Errorf("TryLock on a held key: %v", err)
	}
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := h.Release(ctx); err != nil {
		t.Errorf("second Release: %v", err)
	}
	if _, err := m.Lock(ctx, ""); !errors.Is(err, lock.ErrInvalidKey) {
		t.Errorf("Lock with an empty key: %v", err)
	}
	mu.Lock()
	got := strings.Join(events, ",")
	mu.Unlock()
	if want := "lock.acquire:acquired,lock.acquire:busy,lock.release:released,lock.acquire:invalid"; got != want {
		t.Errorf("events = %s\nwant     %s", got, want)
	}
}

// The Mutex reports through its driver's Observer unless told otherwise.
func TestMutexUsesDriverObserver(t *testing.T) {
	var n atomic.Int64
	obs := observe.Func(func(context.Context, observe.Event) { n.Add(1) })
	store := memstore.New(memstore.WithObserver(obs))
	m, err := lock.NewMutex(store)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Do(t.Context(), "k", func(context.Context, lock.Lease) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if n.Load() != 2 {
		t.Errorf("driver observer saw %d events, want 2 (acquire, release)", n.Load())
	}
	n.Store(0)
	quiet, err := lock.NewMutex(store, lock.WithObserver(nil))
	if err != nil {
		t.Fatal(err)
	}
	if err := quiet.Do(t.Context(), "k", func(context.Context, lock.Lease) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if n.Load() != 0 {
		t.Errorf("WithObserver(nil): %d events reported", n.Load())
	}
}

// Do with a lease lost while fn runs, and fn succeeding anyway: Do still
// reports the loss, because fn's work may have overlapped another holder.
func TestMutexDoReportsLossAfterSuccess(t *testing.T) {
	store := memstore.New()
	var lost atomic.Int64
	m, err := lock.NewMutex(stallRefresh{store}, lock.WithTTL(50*time.Millisecond),
		lock.WithObserver(observe.Func(func(_ context.Context, ev observe.Event) {
			if ev.Op == observe.LockLost {
				lost.Add(1)
			}
		})))
	if err != nil {
		t.Fatal(err)
	}
	err = m.Do(t.Context(), "k", func(ctx context.Context, _ lock.Lease) error {
		<-ctx.Done()
		return nil // ignores the cancellation
	})
	if !errors.Is(err, lock.ErrLockLost) {
		t.Errorf("Do = %v, want ErrLockLost", err)
	}
	if lost.Load() != 1 {
		t.Errorf("lock.lost reported %d times, want 1", lost.Load())
	}
}

// stallRefresh's leases cannot refresh: their watchdog fails until the TTL
// runs out, as when the store is unreachable.
type stallRefresh struct{ lock.Locker }

func (s stallRefresh) Acquire(ctx context.Context, key string, ttl time.Duration) (lock.Lease, error) {
	l, err := s.Locker.Acquire(ctx, key, ttl)
	if err != nil {
		return nil, err
	}
	return stalled{l}, nil
}

type stalled struct{ lock.Lease }

func (stalled) Refresh(ctx context.Context, _ time.Duration) error {
	<-ctx.Done()
	return ctx.Err()
}

// A Do whose fn fails and whose release fails too reports both: the key
// may stay held until its TTL ends.
func TestMutexDoReportsFailedRelease(t *testing.T) {
	m, err := lock.NewMutex(failRelease{memstore.New()})
	if err != nil {
		t.Fatal(err)
	}
	fnErr := errors.New("fn failed")
	err = m.Do(t.Context(), "k", func(context.Context, lock.Lease) error { return fnErr })
	if !errors.Is(err, fnErr) || !errors.Is(err, errUnreachable) || errors.Is(err, lock.ErrLockLost) {
		t.Errorf("Do = %v, want fn's error and the release's", err)
	}
}

var errUnreachable = errors.New("store unreachable")

// failRelease's leases cannot be released.
type failRelease struct{ lock.Locker }

func (s failRelease) Acquire(ctx context.Context, key string, ttl time.Duration) (lock.Lease, error) {
	l, err := s.Locker.Acquire(ctx, key, ttl)
	if err != nil {
		return nil, err
	}
	return unreleasable{l}, nil
}

type unreleasable struct{ lock.Lease }

func (unreleasable) Release(context.Context) error { return errUnreachable }

// WithWaitTimeout bounds the wait for the key, apart from the work's
// context: a Do whose ctx has no deadline gives up waiting after it.
func TestMutexWaitTimeout(t *testing.T) {
	store := memstore.New()
	held, err := store.Acquire(t.Context(), "busy", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(t.Context())
	m, err := lock.NewMutex(store, lock.WithWaitTimeout(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = m.Do(context.Background(), "busy", func(context.Context, lock.Lease) error { return nil })
	if !errors.Is(err, lock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Do on a held key: %v, want ErrNotAcquired and DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Do waited %s with a 50ms wait timeout", d)
	}
	if _, err := lock.NewMutex(store, lock.WithWaitTimeout(-time.Second)); err == nil {
		t.Error("a negative wait timeout was accepted")
	}
}

// A driver that returns a lease which has already ended (its TTL ran out
// while it waited): Do never runs fn on it, gives it back, and asks again.
func TestMutexDoRefusesEndedLease(t *testing.T) {
	store := memstore.New()
	d := &bornEnded{Locker: store, dead: 2}
	m, err := lock.NewMutex(d, lock.WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var ran int
	err = m.Do(t.Context(), "k", func(ctx context.Context, l lock.Lease) error {
		ran++
		select {
		case <-l.Done():
			t.Error("fn ran on a lease that had ended")
		default:
		}
		return nil
	})
	if err != nil || ran != 1 {
		t.Fatalf("Do = %v, fn ran %d times; want nil, once", err, ran)
	}
	if d.calls != 3 {
		t.Errorf("Acquire called %d times, want 3 (two ended leases given back)", d.calls)
	}
	// Every ended lease was released: the key is free.
	l, err := store.TryAcquire(t.Context(), "k", time.Second)
	if err != nil {
		t.Fatalf("key left held: %v", err)
	}
	_ = l.Release(t.Context())

	// A driver that only ever returns ended leases: Lock gives up with
	// ErrNotAcquired instead of spinning.
	d = &bornEnded{Locker: store, dead: 1 << 30}
	m, _ = lock.NewMutex(d, lock.WithTTL(time.Second))
	if _, err := m.TryLock(t.Context(), "k"); !errors.Is(err, lock.ErrNotAcquired) {
		t.Errorf("TryLock over ended leases = %v, want ErrNotAcquired", err)
	}
}

// bornEnded's first dead leases end before Acquire returns them.
type bornEnded struct {
	lock.Locker
	dead, calls int
}

func (b *bornEnded) Acquire(ctx context.Context, key string, ttl time.Duration) (lock.Lease, error) {
	return b.TryAcquire(ctx, key, ttl)
}

func (b *bornEnded) TryAcquire(ctx context.Context, key string, ttl time.Duration) (lock.Lease, error) {
	b.calls++
	l, err := b.Locker.TryAcquire(ctx, key, ttl)
	if err != nil || b.calls > b.dead {
		return l, err
	}
	return ended{l}, nil
}

// ended is a lease whose Done is closed: what a driver returns when the
// lease's deadline passed before the call returned.
type ended struct{ lock.Lease }

var closedCh = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func (ended) Done() <-chan struct{} { return closedCh }
