package idem

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/lock"
)

// watchdog extends the leases of a Guard's claims while their runs are busy,
// every lease/3, on one timer for all of them, and ends a run by a local
// timer when its claim's validity runs out without an extension: the run's
// context is cancelled with lock.ErrLockLost no later than the moment the store
// could let another caller claim the key, counted from before the request
// that granted or last extended the claim. An extension that hangs (a cut
// connection, a paused server) therefore cannot keep a run going past its
// claim: the timer fires whatever the extension is doing.
//
// Why one timer: arming a timer wakes an idle thread of the Go scheduler
// (its net poller must learn the new deadline), a system call on every
// request when each run armed its own. The shared timer is armed for the
// earliest moment due and left armed when runs end, so a run that starts
// and ends before it fires — the common case — touches no timer at all:
// its extension is due later than the one already armed.
type watchdog struct {
	mu    sync.Mutex
	runs  map[*watched]struct{}
	timer *time.Timer
	at    time.Time // when timer fires; zero when it is not armed
}

// watched is one claim the watchdog keeps alive.
type watched struct {
	g      *Guard
	ctx    context.Context // the run's: extensions detach it from its cancellation
	c      idemdriver.Claim
	cancel context.CancelCauseFunc
	due    time.Time // its next extension
	valid  time.Time // when the claim may be someone else's, as last granted or extended
	busy   bool      // an extension is in flight
	wg     sync.WaitGroup
}

// expiryMargin is how long before its validity a run is ended: timers
// fire late on a loaded machine (tens of milliseconds under a garbage
// collection or CPU throttling), and the cancellation takes a moment to
// reach the work it cancels. A tenth of the TTL, up to a second, costs
// nothing while the store answers: the watchdog extends every third of the
// TTL, so the validity stays at least two thirds of it ahead.
func expiryMargin(ttl time.Duration) time.Duration {
	return min(max(ttl/10, time.Millisecond), time.Second)
}

// endAt is when k's run is ended unless its claim is extended before.
func (k *watched) endAt() time.Time { return k.valid.Add(-expiryMargin(k.g.ttl)) }

// earliest returns the earlier of a and b.
func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// runState is what one run of a Guard holds: its context's values and
// its watchdog entry, made together.
type runState struct {
	vals    runValues
	watched watched
}

// watch starts keeping claim c, valid until valid, alive in k (zero); its
// extensions run with ctx's values, not its cancellation.
func (g *Guard) watch(ctx context.Context, k *watched, c idemdriver.Claim, valid time.Time, cancel context.CancelCauseFunc) *watched {
	k.g, k.ctx, k.c, k.cancel = g, ctx, c, cancel
	k.due, k.valid = time.Now().Add(g.ttl/3), valid
	kp := &g.watchdog
	kp.mu.Lock()
	defer kp.mu.Unlock()
	if kp.runs == nil {
		kp.runs = map[*watched]struct{}{}
	}
	kp.runs[k] = struct{}{}
	kp.armLocked(earliest(k.due, k.endAt()))
	return k
}

// stop stops keeping k alive, waits for an extension in flight and returns
// the end of the claim's validity as last extended.
func (k *watched) stop() time.Time {
	kp := &k.g.watchdog
	kp.mu.Lock()
	delete(kp.runs, k)
	kp.mu.Unlock()
	k.wg.Wait()
	kp.mu.Lock()
	defer kp.mu.Unlock()
	return k.valid
}

// armLocked makes the timer fire by at.
func (kp *watchdog) armLocked(at time.Time) {
	if !kp.at.IsZero() && !at.Before(kp.at) {
		return
	}
	kp.at = at
	if kp.timer == nil {
		kp.timer = time.AfterFunc(time.Until(at), kp.fire)
	} else {
		kp.timer.Reset(time.Until(at))
	}
}

// fire ends the runs whose claims have run out, starts the extensions due
// (and those due within a little of now, so that runs which began together
// share one wake-up) and arms the timer for the next of either.
func (kp *watchdog) fire() {
	kp.mu.Lock()
	defer kp.mu.Unlock()
	kp.at = time.Time{}
	now := time.Now()
	var next time.Time
	soonest := func(t time.Time) {
		if next.IsZero() || t.Before(next) {
			next = t
		}
	}
	for k := range kp.runs {
		if !now.Before(k.endAt()) {
			k.cancel(lock.ErrLockLost) // an extension may be in flight: too late
			delete(kp.runs, k)
			continue
		}
		soonest(k.endAt())
		if k.busy {
			continue
		}
		if !k.due.After(now.Add(k.g.ttl / 30)) {
			k.busy = true
			k.wg.Add(1)
			go kp.extend(k)
			continue
		}
		soonest(k.due)
	}
	if !next.IsZero() {
		kp.armLocked(next)
	}
}

func (kp *watchdog) extend(k *watched) {
	defer k.wg.Done()
	g := k.g
	interval := g.ttl / 3
	kp.mu.Lock()
	end := k.endAt()
	kp.mu.Unlock()
	start := time.Now()
	// An answer after the run has ended is of no use: wait no longer.
	ectx, ecancel := context.WithDeadline(context.WithoutCancel(k.ctx), earliest(start.Add(interval), end))
	err := g.store.Extend(ectx, k.c, g.ttl)
	ecancel()
	kp.mu.Lock()
	defer kp.mu.Unlock()
	k.busy = false
	if _, live := kp.runs[k]; !live {
		return // stopped, or ended by the timer meanwhile
	}
	switch {
	case err == nil:
		k.valid = start.Add(g.ttl)
		k.due = time.Now().Add(interval)
	case errors.Is(err, lock.ErrLockLost) || !time.Now().Before(k.endAt()):
		k.cancel(lock.ErrLockLost)
		delete(kp.runs, k)
		return
	default: // unreachable for now: try again soon, while the lease lasts
		k.due = time.Now().Add(max(g.ttl/10, time.Millisecond))
	}
	kp.armLocked(earliest(k.due, k.endAt()))
}
