package lockdriver

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/oncekit/oncekit/core/internal/ctxbound"
	"github.com/oncekit/oncekit/core/lock"
)

// State is where a lease is in its life.
type State int

const (
	// Live: the lease is valid as far as this process knows.
	Live State = iota
	// Released: Release succeeded (or a hand-off passed the key on).
	Released
	// Lost: the store no longer holds the lease's token, or its local
	// deadline passed without a successful Refresh.
	Lost
)

func (s State) String() string {
	switch s {
	case Live:
		return "live"
	case Released:
		return "released"
	case Lost:
		return "lost"
	}
	return fmt.Sprintf("State(%d)", int(s))
}

// Store is the driver's side of one lease: the request that extends its
// hold in the store and the request that frees it. Both report a hold the
// store no longer has for this token with an error matching
// lock.ErrLockLost; any other error means the outcome is unknown (the
// request may or may not have run), and leaves the lease as it was.
// Errors are returned to the caller as they are, so they should name the
// driver, the operation and the key.
type Store interface {
	// StoreRefresh extends the hold to ttl and returns the lease's new
	// local deadline: when this process must stop trusting the hold,
	// counted from before the request was sent (minus any drift
	// allowance), so that it never passes after the store's own expiry.
	// The zero time keeps the deadline as it is.
	StoreRefresh(ctx context.Context, ttl time.Duration) (deadline time.Time, err error)

	// StoreRelease frees the hold (or passes it to the next waiter).
	StoreRelease(ctx context.Context) error
}

// Config describes a lease when it is made.
type Config struct {
	Driver string // the driver's package name, for error messages ("redisstore")
	Key    string
	Token  string
	Fence  uint64

	// Deadline is the local deadline of the acquisition (see
	// Store.StoreRefresh). The zero time sets no timer: the driver ends the
	// lease itself (memstore, whose store is this process).
	Deadline time.Time

	// Store makes the lease's requests.
	Store Store

	// OnEnd, if set, runs once when the lease ends, after Done is closed,
	// with no lock of the Lease held: the driver forgets the lease and lets
	// its next local waiter go.
	OnEnd func(State)

	// OnExpire, if set, runs after OnEnd when the lease ended because its
	// local deadline passed: the driver may free the key in the store
	// early instead of waiting for the store's own expiry.
	OnExpire func()
}

// Lease is what a driver's TryAcquire and Acquire return: a lease with
// exactly lock.Lease's methods and nothing else to reach, whatever a user
// asserts it to. Its driver holds the lease's Control.
type Lease struct{ c *Control }

// Key implements lock.Lease.
func (l *Lease) Key() string { return l.c.cfg.Key }

// Token implements lock.Lease.
func (l *Lease) Token() string { return l.c.cfg.Token }

// Fence implements lock.Lease.
func (l *Lease) Fence() uint64 { return l.c.cfg.Fence }

// Done implements lock.Lease: closed when the lease ends (released or
// lost).
func (l *Lease) Done() <-chan struct{} { return l.c.Done() }

// Deadline implements lock.Lease: the local deadline, or the zero time
// once the lease has ended (or for a lease without a deadline).
func (l *Lease) Deadline() time.Time { return l.c.Deadline() }

// Refresh implements lock.Lease: it extends the hold through the Store and
// moves the local deadline. A refresh that succeeds in the store after the
// local deadline ended the lease gives the key back and reports
// lock.ErrLockLost: Done has closed, so nobody relies on it any more.
func (l *Lease) Refresh(ctx context.Context, ttl time.Duration) error { return l.c.refresh(ctx, ttl) }

// Release implements lock.Lease. It runs under CleanupContext when ctx
// has already ended, and within ReleaseTimeout when ctx has no deadline.
// A Release after a successful one returns nil without a request; so does
// one after the local deadline ended the lease if the store still held
// the key and has now freed it. A Release the store answers with
// lock.ErrLockLost ends the lease as lost; one whose outcome is unknown
// (an unreachable store) leaves it as it was, to be retried.
func (l *Lease) Release(ctx context.Context) error { return l.c.release(ctx) }

var _ lock.Lease = (*Lease)(nil)

// Control is a driver's side of one lease: its lifecycle (held, released
// or lost), the local deadline timer that ends it when no Refresh came in
// time, and the rules every lock.Lease keeps. A driver embeds Control by
// value in its own lease type, calls Init, and hands users Lease() — never
// its own type, which lacks Refresh and Release and so is no lock.Lease.
// A Store that also implements DoneWatcher or Deadliner takes part in
// Done and Deadline.
type Control struct {
	pub  Lease
	cfg  Config
	done chan struct{}

	watch     DoneWatcher // cfg.Store's, if it is one
	deadliner Deadliner   // cfg.Store's, if it is one

	mu       sync.Mutex
	state    State
	deadline time.Time
	expiry   ctxbound.Entry // on the shared timer (ctxbound) while live with a deadline
}

// NewControl returns the Control of a held lease.
func NewControl(cfg Config) *Control {
	l := new(Control)
	l.Init(cfg)
	return l
}

// DoneWatcher is a Store that watches for the end of its hold once
// someone asks for Done (etcdstore, zkstore: a watch on the key, which an
// operator's ForceRelease deletes). WatchDone is called at every Done, and
// must start its watch once.
type DoneWatcher interface {
	WatchDone()
}

// Deadliner is a Store whose deadline is not only the lease's own:
// StoreDeadline gets the lease's (the zero time once it ended) and
// returns the one Deadline reports.
type Deadliner interface {
	StoreDeadline(d time.Time) time.Time
}

// Init makes l, a zero Control embedded in a driver's own lease type, a
// held lease. A driver embeds Control by value and calls Init last, once
// the rest of its lease is set: a deadline that has already passed fires
// the timer at once, and its OnEnd and OnExpire must then find the
// driver's lease complete.
func (l *Control) Init(cfg Config) {
	l.mu.Lock() // the shared timer may fire before Init returns
	defer l.mu.Unlock()
	l.pub.c = l
	l.watch, _ = cfg.Store.(DoneWatcher)
	l.deadliner, _ = cfg.Store.(Deadliner)
	l.cfg, l.done, l.deadline = cfg, make(chan struct{}), cfg.Deadline
	if !cfg.Deadline.IsZero() {
		l.expiry.Owner = (*leaseExpiry)(l)
		l.expiry.Watch(cfg.Deadline)
	}
}

// Lease is the lease users hold: what the driver's TryAcquire and Acquire
// return.
func (l *Control) Lease() *Lease { return &l.pub }

// Key is the lease's key.
func (l *Control) Key() string { return l.cfg.Key }

// Token is the lease's token.
func (l *Control) Token() string { return l.cfg.Token }

// Fence is the lease's fence.
func (l *Control) Fence() uint64 { return l.cfg.Fence }

// Done is closed when the lease ends (the Store's WatchDone is asked
// first, when it is a DoneWatcher).
func (l *Control) Done() <-chan struct{} {
	if l.watch != nil {
		l.watch.WatchDone()
	}
	return l.done
}

// Ended is Done's channel, without asking a DoneWatcher to watch.
func (l *Control) Ended() <-chan struct{} { return l.done }

// State reports where the lease is in its life.
func (l *Control) State() State {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.state
}

// Deadline is the lease's deadline: the local one, or the zero time once
// the lease has ended (or for a lease without a deadline), as the Store
// says when it is a Deadliner.
func (l *Control) Deadline() time.Time {
	d := l.LocalDeadline()
	if l.deadliner != nil {
		return l.deadliner.StoreDeadline(d)
	}
	return d
}

// LocalDeadline is the local deadline, or the zero time once the lease has
// ended (or for a lease without a deadline).
func (l *Control) LocalDeadline() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state != Live {
		return time.Time{}
	}
	return l.deadline
}

// Remaining is the time left until the local deadline, 0 once it passed or
// the lease ended, and -1 for a lease without a deadline.
func (l *Control) Remaining() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.state != Live:
		return 0
	case l.deadline.IsZero():
		return -1
	}
	return max(0, time.Until(l.deadline))
}

// End ends a held lease in state st (Released or Lost): Done closes, the
// lease leaves the deadline timer, OnEnd runs. It reports whether this call ended it. The
// caller may hold its own locks, as long as OnEnd does not take them.
func (l *Control) End(st State) bool {
	l.mu.Lock()
	if l.state != Live {
		l.mu.Unlock()
		return false
	}
	l.state = st
	l.expiry.Unwatch()
	close(l.done)
	l.mu.Unlock()
	if l.cfg.OnEnd != nil {
		l.cfg.OnEnd(st)
	}
	return true
}

// EndQuietly is End without OnEnd, for a driver that ends the lease while
// holding the locks OnEnd takes, and has done OnEnd's work itself.
func (l *Control) EndQuietly(st State) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state != Live {
		return false
	}
	l.state = st
	l.expiry.Unwatch()
	close(l.done)
	return true
}

// leaseExpiry is a Control as the shared timer sees it: its method is not
// one of Control's.
type leaseExpiry Control

func (e *leaseExpiry) ExpireAtDeadline() { (*Control)(e).expire() }

// expire runs at the local deadline. With no successful Refresh since, the
// lease is no longer ours.
func (l *Control) expire() {
	l.mu.Lock()
	if l.state != Live {
		l.mu.Unlock()
		return
	}
	if time.Until(l.deadline) > 0 { // refreshed after the timer fired
		l.expiry.Watch(l.deadline)
		l.mu.Unlock()
		return
	}
	l.mu.Unlock()
	if l.End(Lost) && l.cfg.OnExpire != nil {
		l.cfg.OnExpire()
	}
}

func (l *Control) errorf(op string, err error) error {
	return fmt.Errorf("%s: %s %q: %w", l.cfg.Driver, op, l.cfg.Key, err)
}

// refresh is Lease.Refresh.
func (l *Control) refresh(ctx context.Context, ttl time.Duration) error {
	if err := ValidateTTL(ttl); err != nil {
		return err
	}
	if l.State() != Live {
		return l.errorf("refresh", lock.ErrLockLost)
	}
	deadline, err := l.cfg.Store.StoreRefresh(ctx, ttl)
	if err != nil {
		if errors.Is(err, lock.ErrLockLost) {
			l.End(Lost)
		}
		return err
	}
	l.mu.Lock()
	if l.state != Live {
		l.mu.Unlock()
		cctx, cancel := CleanupContext(ctx)
		defer cancel()
		_ = l.cfg.Store.StoreRelease(cctx)
		return l.errorf("refresh", lock.ErrLockLost)
	}
	if !deadline.IsZero() {
		l.deadline = deadline
		if l.expiry.Owner != nil {
			l.expiry.Watch(deadline)
		}
	}
	l.mu.Unlock()
	return nil
}

// release is Lease.Release.
func (l *Control) release(ctx context.Context) error {
	if l.State() == Released {
		return nil
	}
	ctx, cancel := ReleaseContext(ctx)
	defer cancel()
	err := l.cfg.Store.StoreRelease(ctx)
	switch {
	case err == nil:
		if !l.End(Released) {
			// Ended before (the local deadline passed) while the key was
			// still ours in the store: it is now freed, as asked.
			l.mu.Lock()
			l.state = Released
			l.mu.Unlock()
		}
		return nil
	case errors.Is(err, lock.ErrLockLost):
		l.End(Lost)
		if l.State() == Released { // a concurrent Release won
			return nil
		}
		return err
	default:
		return err
	}
}
