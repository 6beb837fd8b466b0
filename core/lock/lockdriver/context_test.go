package lockdriver_test

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncekit/oncekit/core/lock/lockdriver"
)

type ctxKey struct{}

func TestDeadlineOnly(t *testing.T) {
	parent, cancelParent := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "v"))
	bounded, cancel := lockdriver.BoundedContext(parent, time.Now().Add(time.Minute))
	defer cancel()
	cancelParent() // the bounded context does not follow its parent
	if err := bounded.Err(); err != nil {
		t.Fatalf("a BoundedContext ended with its parent: %v", err)
	}
	if bounded.Value(ctxKey{}) != "v" {
		t.Error("a BoundedContext lost its parent's values")
	}
	cleanup, cancelCleanup := lockdriver.CleanupContext(parent)
	defer cancelCleanup()
	own, cancelOwn := context.WithCancel(bounded)
	defer cancelOwn()
	timed, cancelTimed := context.WithTimeout(context.Background(), time.Minute)
	defer cancelTimed()
	for _, c := range []struct {
		name string
		ctx  context.Context
		want bool
	}{
		{"Background", context.Background(), true},
		{"WithoutCancel", context.WithoutCancel(parent), true},
		{"BoundedContext", bounded, true},
		{"CleanupContext", cleanup, true},
		{"values added to a BoundedContext", context.WithValue(bounded, ctxKey{}, "w"), true},
		{"a cancel of its own over a BoundedContext", own, false},
		{"WithTimeout", timed, false},
		{"a cancelled parent", parent, false},
	} {
		if got := lockdriver.DeadlineOnly(c.ctx); got != c.want {
			t.Errorf("DeadlineOnly(%s) = %v, want %v", c.name, got, c.want)
		}
	}
	short, cancelShort := lockdriver.BoundedContext(context.Background(), time.Now().Add(10*time.Millisecond))
	defer cancelShort()
	<-short.Done()
	if short.Err() != context.DeadlineExceeded {
		t.Errorf("a BoundedContext past its deadline: %v", short.Err())
	}
}

func TestReleaseContext(t *testing.T) {
	// Background and TODO share one bounded context for a moment.
	a, cancelA := lockdriver.ReleaseContext(context.Background())
	defer cancelA()
	b, cancelB := lockdriver.ReleaseContext(context.TODO())
	cancelB() // a caller's cancel does not end the shared context
	deadline, ok := a.Deadline()
	if left := time.Until(deadline); !ok || left > lockdriver.ReleaseTimeout || left < lockdriver.ReleaseTimeout-time.Second {
		t.Errorf("a Release without a context of its own: deadline in %v (set %v), want about %v", left, ok, lockdriver.ReleaseTimeout)
	}
	if a != b || b.Err() != nil || !lockdriver.DeadlineOnly(a) {
		t.Errorf("shared %v, ended %v, deadline only %v", a == b, b.Err(), lockdriver.DeadlineOnly(a))
	}

	// Values are kept, in a context of the caller's own.
	v, cancelV := lockdriver.ReleaseContext(context.WithValue(context.Background(), ctxKey{}, "v"))
	defer cancelV()
	if _, ok := v.Deadline(); !ok || v.Value(ctxKey{}) != "v" || v == a || !lockdriver.DeadlineOnly(v) {
		t.Error("a context with values lost them or got no deadline")
	}

	// A deadline of the caller's is kept; a cancellable context gets one.
	timed, cancelTimed := context.WithTimeout(context.Background(), time.Hour)
	defer cancelTimed()
	if c, cancel := lockdriver.ReleaseContext(timed); c != timed {
		t.Error("a context with a deadline was replaced")
	} else {
		cancel()
	}
	live, cancelLive := context.WithCancel(context.Background())
	c, cancel := lockdriver.ReleaseContext(live)
	if _, ok := c.Deadline(); !ok || lockdriver.DeadlineOnly(c) {
		t.Error("a cancellable context got no deadline, or lost its cancellation")
	}
	cancelLive()
	<-c.Done()
	cancel()

	// An ended context gets a clean-up context that has not ended.
	c, cancel = lockdriver.ReleaseContext(live)
	defer cancel()
	if c.Err() != nil || !lockdriver.DeadlineOnly(c) {
		t.Errorf("a Release after its context ended: %v", c.Err())
	}
}

// A BoundedContext makes its channel and timer only when asked for Done,
// and behaves as a context.WithDeadline either way.
func TestBoundedContextEnds(t *testing.T) {
	parent, cancelParent := context.WithCancelCause(context.Background())
	cancelParent(context.Canceled)
	// Never asked for Done: Err still ends at the deadline.
	a, cancelA := lockdriver.BoundedContext(parent, time.Now().Add(20*time.Millisecond))
	defer cancelA()
	if a.Err() != nil || context.Cause(a) != nil {
		t.Fatalf("a BoundedContext of a cancelled parent: %v, cause %v", a.Err(), context.Cause(a))
	}
	time.Sleep(30 * time.Millisecond)
	if a.Err() != context.DeadlineExceeded || context.Cause(a) != context.DeadlineExceeded {
		t.Errorf("past its deadline, never asked for Done: %v, cause %v", a.Err(), context.Cause(a))
	}
	select {
	case <-a.Done():
	default:
		t.Error("Done of a context past its deadline is open")
	}
	// Cancelled before its deadline, Done asked before and after.
	b, cancelB := lockdriver.BoundedContext(context.Background(), time.Now().Add(time.Hour))
	done := b.Done()
	cancelB()
	<-done
	if b.Err() != context.Canceled {
		t.Errorf("cancelled: %v", b.Err())
	}
	c, cancelC := lockdriver.BoundedContext(context.Background(), time.Now().Add(time.Hour))
	cancelC()
	<-c.Done()
	if dl, ok := c.Deadline(); !ok || time.Until(dl) < 59*time.Minute {
		t.Errorf("Deadline = %v, %v", dl, ok)
	}
	// A child follows it.
	d, cancelD := lockdriver.BoundedContext(context.Background(), time.Now().Add(10*time.Millisecond))
	defer cancelD()
	child, cancelChild := context.WithCancel(d)
	defer cancelChild()
	<-child.Done()
	if child.Err() != context.DeadlineExceeded {
		t.Errorf("child: %v", child.Err())
	}
}

// A context derived from a BoundedContext (context.WithCancel, or the
// context.AfterFunc pgx puts on every query's context) is tied to it
// without a goroutine of its own, ends when it ends, and lets go of it
// when it ends first.
func TestBoundedContextDerivesWithoutGoroutines(t *testing.T) {
	b, cancel := lockdriver.BoundedContext(context.Background(), time.Now().Add(time.Minute))
	before := runtime.NumGoroutine()
	const n = 200
	children := make([]context.Context, n)
	cancels := make([]context.CancelFunc, n)
	for i := range children {
		children[i], cancels[i] = context.WithCancel(b)
	}
	var called atomic.Int32
	stopped := context.AfterFunc(b, func() { called.Add(1) })
	kept := context.AfterFunc(b, func() { called.Add(1) })
	if got := runtime.NumGoroutine() - before; got > n/10 {
		t.Errorf("%d contexts derived from a BoundedContext started %d goroutines", n, got)
	}
	cancels[0]() // a child ending first leaves the parent as it was
	if b.Err() != nil || children[1].Err() != nil {
		t.Fatalf("a child's cancel ended its parent or a sibling: %v, %v", b.Err(), children[1].Err())
	}
	if !stopped() {
		t.Error("stop of an AfterFunc not yet run reported false")
	}
	cancel()
	for i, c := range children[1:] {
		select {
		case <-c.Done():
		case <-time.After(5 * time.Second):
			t.Fatalf("child %d still running 5 s after its BoundedContext ended", i+1)
		}
		if !errors.Is(c.Err(), context.Canceled) {
			t.Fatalf("child %d: %v, want context.Canceled", i+1, c.Err())
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for called.Load() != 1 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if n := called.Load(); n != 1 {
		t.Errorf("%d AfterFunc functions ran, want 1 (one was stopped)", n)
	}
	if kept() {
		t.Error("stop of an AfterFunc already run reported true")
	}
	for _, c := range cancels {
		c()
	}
}

// AfterFunc on a BoundedContext that has ended runs f, but not on the
// caller's goroutine: the context package calls it holding the lock of
// the context it derives, which f (that context's cancel) takes — a
// context derived just as its BoundedContext ends would deadlock.
func TestBoundedContextAfterFuncOnceEnded(t *testing.T) {
	b, cancel := lockdriver.BoundedContext(context.Background(), time.Now().Add(time.Minute))
	cancel()
	af, ok := b.(interface{ AfterFunc(func()) func() bool })
	if !ok {
		t.Fatal("a BoundedContext has no AfterFunc method")
	}
	var mu sync.Mutex // (the derived context's lock, in the context package)
	calls := 0
	returned, ran := make(chan struct{}), make(chan struct{})
	go func() {
		mu.Lock()
		af.AfterFunc(func() {
			mu.Lock()
			calls++
			mu.Unlock()
			close(ran)
		})
		mu.Unlock()
		close(returned)
	}()
	for _, ch := range []chan struct{}{returned, ran} {
		select {
		case <-ch:
		case <-time.After(5 * time.Second):
			t.Fatal("AfterFunc of an ended BoundedContext ran f on the caller's goroutine, or never")
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if calls != 1 {
		t.Errorf("f ran %d times, want once", calls)
	}
}
