package idem

import (
	"context"
	"errors"
	"sync"
	"time"
)

// keeper extends the leases of a Guard's claims while their runs are busy,
// every lease/3, on one timer for all of them. When it cannot and a lease
// has run out, or the store says a claim is lost, it cancels that run with
// ErrLockLost.
//
// Why one timer: arming a timer wakes an idle thread of the Go scheduler
// (its net poller must learn the new deadline), a system call on every
// request when each run armed its own. The shared timer is armed for the
// earliest extension due and left armed when runs end, so a run that
// starts and ends before it fires — the common case — touches no timer at
// all: its extension is due later than the one already armed.
type keeper struct {
	mu    sync.Mutex
	runs  map[*kept]struct{}
	timer *time.Timer
	at    time.Time // when timer fires; zero when it is not armed
}

// kept is one claim being kept alive.
type kept struct {
	g      *Guard
	ctx    context.Context // detached from the caller's cancellation
	c      Claim
	cancel context.CancelCauseFunc
	due    time.Time // its next extension
	valid  time.Time // the end of its lease as last extended
	busy   bool      // an extension is in flight
	wg     sync.WaitGroup
}

// keep starts keeping claim c alive; ctx must not end before stop.
func (g *Guard) keep(ctx context.Context, c Claim, cancel context.CancelCauseFunc) *kept {
	now := time.Now()
	k := &kept{g: g, ctx: ctx, c: c, cancel: cancel, due: now.Add(g.lease / 3), valid: now.Add(g.lease)}
	kp := &g.keeper
	kp.mu.Lock()
	defer kp.mu.Unlock()
	if kp.runs == nil {
		kp.runs = map[*kept]struct{}{}
	}
	kp.runs[k] = struct{}{}
	kp.armLocked(k.due)
	return k
}

// stop stops keeping k alive, waits for an extension in flight and returns
// the end of the claim's lease as last extended.
func (k *kept) stop() time.Time {
	kp := &k.g.keeper
	kp.mu.Lock()
	delete(kp.runs, k)
	kp.mu.Unlock()
	k.wg.Wait()
	kp.mu.Lock()
	defer kp.mu.Unlock()
	return k.valid
}

// armLocked makes the timer fire by at.
func (kp *keeper) armLocked(at time.Time) {
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

// fire starts the extensions due (and those due within a little of now,
// so that runs which began together share one wake-up) and arms the timer
// for the next one.
func (kp *keeper) fire() {
	kp.mu.Lock()
	defer kp.mu.Unlock()
	kp.at = time.Time{}
	var next time.Time
	for k := range kp.runs {
		if k.busy {
			continue
		}
		if !k.due.After(time.Now().Add(k.g.lease / 30)) {
			k.busy = true
			k.wg.Add(1)
			go kp.extend(k)
			continue
		}
		if next.IsZero() || k.due.Before(next) {
			next = k.due
		}
	}
	if !next.IsZero() {
		kp.armLocked(next)
	}
}

func (kp *keeper) extend(k *kept) {
	defer k.wg.Done()
	g := k.g
	interval := g.lease / 3
	start := time.Now()
	ectx, ecancel := context.WithTimeout(k.ctx, interval)
	err := g.store.Extend(ectx, k.c, g.lease)
	ecancel()
	kp.mu.Lock()
	defer kp.mu.Unlock()
	k.busy = false
	switch {
	case err == nil:
		k.valid = start.Add(g.lease)
		k.due = time.Now().Add(interval)
	case errors.Is(err, ErrLockLost) || !time.Now().Before(k.valid):
		k.cancel(ErrLockLost)
		delete(kp.runs, k)
		return
	default: // unreachable for now: try again soon, while the lease lasts
		k.due = time.Now().Add(max(g.lease/10, time.Millisecond))
	}
	if _, live := kp.runs[k]; live {
		kp.armLocked(k.due)
	}
}
