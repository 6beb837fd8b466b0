package ctxbound

import (
	"context"
	"sync"
	"time"

	"github.com/oncekit/oncekit/core/internal/bounds"
)

// Cleanup returns a context for clean-up work (Release, undoing a
// half-finished Acquire, giving back a claim) that keeps ctx's values but
// not its cancellation, bounded by bounds.Cleanup (a Bounded context).
func Cleanup(ctx context.Context) (context.Context, context.CancelFunc) {
	return Bounded(ctx, time.Now().Add(bounds.Cleanup))
}

// boundedKey marks a BoundedContext: its Value is the context itself.
type boundedKey struct{}

// bounded is a BoundedContext: a deadline over ctx's values, which
// answers its own boundedKey and hides ctx's cancellation from
// context.Cause (as context.WithoutCancel does, without the allocation of
// one). It is made on every Release and completion. Its channel is made
// only when someone asks for Done (go-redis and pgx do on every request),
// and then it joins the one timer that ends such contexts at their
// deadlines (deadlines.go) rather than arming a timer of its own.
type bounded struct {
	values   context.Context // the caller's: only its Value is used
	deadline time.Time

	mu     sync.Mutex
	done   chan struct{} // made by the first Done or AfterFunc
	expiry Entry         // on the shared timer (deadlines.go) once done is made
	err    error
	afters map[uint64]func() // AfterFunc's, run when the context ends
	nextID uint64
}

func (b *bounded) Deadline() (time.Time, bool) { return b.deadline, true }

func (b *bounded) Done() <-chan struct{} {
	b.mu.Lock()
	b.armLocked()
	done := b.done
	b.mu.Unlock()
	return done
}

// armLocked makes done, and has the context ended at its deadline, once.
func (b *bounded) armLocked() {
	if b.done != nil {
		return
	}
	b.done = make(chan struct{})
	switch d := time.Until(b.deadline); {
	case b.err != nil:
		close(b.done)
	case d <= 0:
		b.err = context.DeadlineExceeded
		close(b.done)
	default:
		b.expiry.Owner = b
		b.expiry.Watch(b.deadline)
	}
}

// AfterFunc arranges for f to be called once the context ends, and
// returns the function that cancels that (true if it did before f was
// called). The context package looks for this method: a context derived
// from a BoundedContext (context.WithCancel, context.AfterFunc — pgx
// watches every query's context with one) is then tied to it without a
// goroutine of its own per derivation. f is called on the goroutine that
// ends the context (on one of its own when it has ended already), so it
// must not block (the context package's are a child's cancel).
func (b *bounded) AfterFunc(f func()) (stop func() bool) {
	b.mu.Lock()
	b.armLocked()
	if b.err != nil {
		b.mu.Unlock()
		// Not on this goroutine: the context package calls AfterFunc
		// holding the child's lock, which f (the child's cancel) takes.
		go f()
		return func() bool { return false }
	}
	if b.afters == nil {
		b.afters = map[uint64]func(){}
	}
	b.nextID++
	id := b.nextID
	b.afters[id] = f
	b.mu.Unlock()
	return func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		_, ok := b.afters[id]
		delete(b.afters, id)
		return ok
	}
}

func (b *bounded) Err() error {
	b.mu.Lock()
	var run map[uint64]func()
	if b.err == nil && !time.Now().Before(b.deadline) {
		run = b.endLocked(context.DeadlineExceeded)
	}
	err := b.err
	b.mu.Unlock()
	for _, f := range run {
		f()
	}
	return err
}

func (b *bounded) ExpireAtDeadline() { b.end(context.DeadlineExceeded) }

// end ends the context with err, unless it has ended.
func (b *bounded) end(err error) {
	b.mu.Lock()
	var run map[uint64]func()
	if b.err == nil {
		run = b.endLocked(err)
	}
	b.mu.Unlock()
	for _, f := range run {
		f()
	}
}

// endLocked ends the context with err and returns the AfterFunc
// functions to call once b.mu is unlocked.
func (b *bounded) endLocked(err error) map[uint64]func() {
	b.err = err
	if b.done != nil {
		b.expiry.Unwatch()
		close(b.done)
	}
	run := b.afters
	b.afters = nil
	return run
}

func (b *bounded) Value(key any) any {
	switch key {
	case boundedKey{}:
		return b
	case causeKey:
		return nil // context.Cause(b) is then b.Err(), not the caller's cause
	}
	return b.values.Value(key)
}

// causeKey is the key context.Cause looks a context's own cancellation up
// by (the context package's, unexported): a context whose Value answers
// nil for it has the cause of its Err. It is learned once, by asking
// Cause about a context that records what it is asked for; the context
// tests check that a BoundedContext of a cancelled parent has no cause.
var causeKey = func() any {
	var p causeProbe
	_ = context.Cause(&p)
	if p.key == nil {
		return causeProbe{} // Cause asked nothing: match no key
	}
	return p.key
}()

// causeProbe is the context causeKey asks context.Cause about.
type causeProbe struct{ key any }

func (*causeProbe) Deadline() (time.Time, bool) { return time.Time{}, false }
func (*causeProbe) Done() <-chan struct{}       { return nil }
func (*causeProbe) Err() error                  { return context.Canceled } // Cause asks Value only of an ended context
func (p *causeProbe) Value(key any) any {
	if p.key == nil {
		p.key = key
	}
	return nil
}

func (b *bounded) String() string { return "lockdriver.BoundedContext" }

// Bounded returns a context that keeps ctx's values but not its
// cancellation and ends at deadline — and at no other time before its
// cancel function is called, which its maker does only once the work it
// bounds is over. DeadlineOnly recognises it (and the contexts that only
// add values to it), so that a driver whose client enforces context
// deadlines on its own (go-redis with ContextTimeoutEnabled) can run a
// request under it on the caller's goroutine, instead of on a background
// one that lets the caller return the moment the context is cancelled.
func Bounded(ctx context.Context, deadline time.Time) (context.Context, context.CancelFunc) {
	b := &bounded{values: ctx, deadline: deadline}
	return b, func() { b.end(context.Canceled) }
}

// releaseEpoch is how long one shared context bounds the Releases of
// callers without a context of their own (ReleaseContext).
const releaseEpoch = 100 * time.Millisecond

// shared is the BoundedContext those Releases share: made every
// releaseEpoch, never cancelled before its deadline (the deadline ends it).
var shared struct {
	mu     sync.Mutex
	ctx    context.Context
	cancel context.CancelFunc // kept for vet; the deadline ends it
	until  time.Time
}

// Release returns the context a Release under ctx runs in, and the
// function to call when it is over: ctx itself when it has a deadline;
// CleanupContext when it has ended already; ctx within ReleaseTimeout when
// it has no deadline. context.Background and context.TODO, the usual
// context of a deferred Release, share one BoundedContext for
// releaseEpoch (a deadline between ReleaseTimeout - releaseEpoch and
// ReleaseTimeout away): a timer and a context per Release are the
// larger part of what the call costs beyond the request.
func Release(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, bounded := ctx.Deadline(); bounded && ctx.Err() == nil {
		return ctx, func() {}
	}
	switch {
	case ctx.Err() != nil:
		return Cleanup(ctx)
	case ctx == context.Background() || ctx == context.TODO():
		now := time.Now()
		shared.mu.Lock()
		defer shared.mu.Unlock()
		if shared.ctx == nil || now.After(shared.until) {
			shared.ctx, shared.cancel = Bounded(context.Background(), now.Add(bounds.Cleanup))
			shared.until = now.Add(releaseEpoch)
		}
		return shared.ctx, func() {}
	case ctx.Done() == nil:
		return Bounded(ctx, time.Now().Add(bounds.Cleanup))
	}
	return context.WithTimeout(ctx, bounds.Cleanup)
}

// DeadlineOnly reports whether ctx can end only at its deadline: it never
// ends (no Done channel), or it is a BoundedContext or only adds values to
// one. A context derived from one with a cancel of its own is not.
func DeadlineOnly(ctx context.Context) bool {
	if b, ok := ctx.(*bounded); ok && b != nil {
		return true // (without asking for Done, which makes its channel)
	}
	done := ctx.Done()
	if done == nil {
		return true
	}
	b, _ := ctx.Value(boundedKey{}).(*bounded)
	return b != nil && b.Done() == done
}
