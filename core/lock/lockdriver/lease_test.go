package lockdriver_test

import (
	"context"
	"errors"
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/lock/lockdriver"
)

// scripted is a lockdriver.Store whose answers the test sets.
type scripted struct {
	refreshErr, releaseErr error
	refreshTakes           time.Duration
	releases               atomic.Int32
}

func (s *scripted) StoreRefresh(context.Context, time.Duration) (time.Time, error) {
	time.Sleep(s.refreshTakes)
	return time.Now().Add(time.Hour), s.refreshErr
}

func (s *scripted) StoreRelease(context.Context) error {
	s.releases.Add(1)
	return s.releaseErr
}

func newLease(st *scripted, deadline time.Time, ended *atomic.Int32) *lockdriver.Control {
	return lockdriver.NewControl(lockdriver.Config{Driver: "test", Key: "k", Token: "t", Fence: 7,
		Deadline: deadline, Store: st, OnEnd: func(lockdriver.State) { ended.Add(1) }})
}

func waitDone(t *testing.T, l *lockdriver.Control) {
	t.Helper()
	select {
	case <-l.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Done did not close")
	}
}

func TestReleaseAfterDeadlineThenAgain(t *testing.T) {
	st := &scripted{}
	var ended atomic.Int32
	l := newLease(st, time.Now().Add(10*time.Millisecond), &ended)
	waitDone(t, l)
	if got := l.State(); got != lockdriver.Lost {
		t.Fatalf("state after the deadline = %s, want lost", got)
	}
	if err := l.Lease().Release(t.Context()); err != nil {
		t.Fatalf("Release while the store still held the key: %v", err)
	}
	if err := l.Lease().Release(t.Context()); err != nil {
		t.Fatalf("second Release: %v, want nil", err)
	}
	if n := st.releases.Load(); n != 1 {
		t.Errorf("%d release requests, want 1", n)
	}
	// OnEnd runs after Done closes, on the deadline timer's goroutine:
	// wait for it, then check that the Releases did not run it again.
	for wait := time.Now().Add(5 * time.Second); ended.Load() == 0 && time.Now().Before(wait); {
		time.Sleep(time.Millisecond)
	}
	if n := ended.Load(); n != 1 {
		t.Errorf("OnEnd ran %d times, want 1", n)
	}
}

func TestReleaseUnknownOutcomeKeepsLease(t *testing.T) {
	st := &scripted{releaseErr: errors.New("connection reset")}
	var ended atomic.Int32
	l := newLease(st, time.Now().Add(time.Hour), &ended)
	if err := l.Lease().Release(t.Context()); err == nil {
		t.Fatal("Release with a failing store returned nil")
	}
	if l.State() != lockdriver.Live {
		t.Fatalf("state after an unknown outcome = %s, want held (retryable)", l.State())
	}
	st.releaseErr = nil
	if err := l.Lease().Release(t.Context()); err != nil {
		t.Fatalf("retried Release: %v", err)
	}
	waitDone(t, l)
}

func TestReleaseNotOurs(t *testing.T) {
	st := &scripted{releaseErr: lock.ErrLockLost}
	var ended atomic.Int32
	l := newLease(st, time.Now().Add(time.Hour), &ended)
	if err := l.Lease().Release(t.Context()); !errors.Is(err, lock.ErrLockLost) {
		t.Fatalf("Release = %v, want ErrLockLost", err)
	}
	waitDone(t, l)
	if l.State() != lockdriver.Lost {
		t.Fatalf("state = %s, want lost", l.State())
	}
}

func TestRefreshAfterDeadlineGivesKeyBack(t *testing.T) {
	st := &scripted{}
	var ended atomic.Int32
	l := newLease(st, time.Now().Add(5*time.Millisecond), &ended)
	waitDone(t, l)
	if err := l.Lease().Refresh(t.Context(), time.Second); !errors.Is(err, lock.ErrLockLost) {
		t.Fatalf("Refresh of an ended lease = %v, want ErrLockLost", err)
	}
	if n := st.releases.Load(); n != 0 {
		t.Fatalf("a refresh refused locally sent %d releases", n)
	}
}

func TestRefreshLandingAfterDeadlineGivesKeyBack(t *testing.T) {
	st := &scripted{refreshTakes: 50 * time.Millisecond}
	var ended atomic.Int32
	l := newLease(st, time.Now().Add(10*time.Millisecond), &ended)
	if err := l.Lease().Refresh(t.Context(), time.Second); !errors.Is(err, lock.ErrLockLost) {
		t.Fatalf("Refresh that landed after the deadline = %v, want ErrLockLost", err)
	}
	if n := st.releases.Load(); n != 1 {
		t.Fatalf("%d releases after a late refresh, want 1 (the key given back)", n)
	}
}

func TestRefreshMovesDeadline(t *testing.T) {
	st := &scripted{}
	var ended atomic.Int32
	l := newLease(st, time.Now().Add(50*time.Millisecond), &ended)
	if err := l.Lease().Refresh(t.Context(), time.Hour); err != nil {
		t.Fatal(err)
	}
	if r := l.Remaining(); r < 30*time.Minute {
		t.Fatalf("Remaining after Refresh = %s, want about an hour", r)
	}
	select {
	case <-l.Done():
		t.Fatal("Done closed at the old deadline")
	case <-time.After(100 * time.Millisecond):
	}
}

func TestCheckAcquire(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := lockdriver.CheckAcquire(ctx, "k", time.Second); !errors.Is(err, lock.ErrNotAcquired) || !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
	if _, err := lockdriver.CheckAcquire(t.Context(), "", time.Second); !errors.Is(err, lock.ErrInvalidKey) {
		t.Fatalf("empty key: %v", err)
	}
	if _, err := lockdriver.CheckAcquire(t.Context(), "k", 0); !errors.Is(err, lock.ErrInvalidTTL) {
		t.Fatalf("zero TTL: %v", err)
	}
}

// A lease whose deadline has passed before Init fires at once; its OnEnd
// finds the driver's lease complete, because Init runs in place.
func TestInitPastDeadlineSeesCompleteLease(t *testing.T) {
	type driverLease struct {
		lockdriver.Control
		name string
	}
	got := make(chan string, 1)
	d := &driverLease{name: "driver"}
	d.Init(lockdriver.Config{Driver: "test", Key: "k", Token: "t", Deadline: time.Now().Add(-time.Second), Store: &scripted{},
		OnEnd: func(lockdriver.State) { got <- d.Key() + "/" + d.name }})
	if s := <-got; s != "k/driver" {
		t.Fatalf("OnEnd saw %q", s)
	}
	select {
	case <-d.Done():
	default:
		t.Fatal("Done is open after the deadline fired")
	}
}

// What a driver hands out is sealed by construction: a user who asserts a
// lease to anything finds lock.Lease's methods and no others — not the
// lifecycle (End, State), not the Store's requests.
func TestLeaseIsSealed(t *testing.T) {
	var ended atomic.Int32
	c := newLease(&scripted{}, time.Now().Add(time.Minute), &ended)
	var l lock.Lease = c.Lease()
	if _, ok := l.(lockdriver.Store); ok {
		t.Error("a lease exposes its Store's requests")
	}
	if _, ok := l.(interface{ End(lockdriver.State) bool }); ok {
		t.Error("a lease exposes End")
	}
	if _, ok := l.(interface{ State() lockdriver.State }); ok {
		t.Error("a lease exposes State")
	}
	if n := reflect.TypeOf(l).NumMethod(); n != reflect.TypeOf((*lock.Lease)(nil)).Elem().NumMethod() {
		t.Errorf("a lease has %d methods, lock.Lease %d", n, reflect.TypeOf((*lock.Lease)(nil)).Elem().NumMethod())
	}
	if err := l.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
}
