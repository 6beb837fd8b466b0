package job

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/lock/lockdriver"
)

// Store is what a job needs of a driver: every oncekit driver is both.
type Store interface {
	lock.Locker
	idemdriver.Store
}

// Schedule gives the first tick after t. robfig/cron/v3's cron.Schedule
// is one (cron.ParseStandard("*/5 * * * *")); Every is another. Next
// returns the zero time when there is no later tick.
type Schedule interface {
	Next(t time.Time) time.Time
}

// Every is a Schedule of a tick every d, at the multiples of d since the
// Unix epoch, so that every replica computes the same ticks whenever it
// started. d must be at least a millisecond.
func Every(d time.Duration) Schedule { return every(d) }

type every time.Duration

func (e every) Next(t time.Time) time.Time {
	d := int64(e)
	if d <= 0 {
		return time.Time{}
	}
	n := t.UnixNano()
	k := n / d
	if n < 0 && n%d != 0 {
		k-- // floor for times before 1970
	}
	return time.Unix(0, (k+1)*d).UTC()
}

// Tick is one scheduled run of a job, as its function sees it.
type Tick struct {
	Job string    // the job's name
	At  time.Time // the scheduled time of the tick (UTC), not when a clock reached it
	// Fence is the fence of the job's lock for this run: pass it to what
	// the run writes, so that a run whose lock was lost cannot overwrite a
	// later run's work. Zero WithOverlap.
	Fence uint64
	// Attempt is 1 for the tick's first run, more when earlier runs of it
	// failed or died (idem.AttemptFrom): check what they did first.
	Attempt int
}

// Option configures Run.
type Option func(*options)

type options struct {
	ttl       time.Duration
	retention time.Duration
	catchUp   time.Duration
	overlap   bool
	now       func() time.Time
	onError   func(Tick, error)
}

// WithTTL sets how long a crashed run holds its tick and the job's lock
// before another replica takes over (the claim and the lock are extended
// while the run is alive). Default 10 s.
func WithTTL(d time.Duration) Option { return func(o *options) { o.ttl = d } }

// WithRetention sets how long a tick is remembered as done: it must
// exceed the largest clock skew between replicas (a replica whose clock is
// later than that would run the tick again) and the catch-up window. Each
// tick keeps one record that long. Default 10 minutes, or twice
// WithCatchUp's window if that is longer.
func WithRetention(d time.Duration) Option { return func(o *options) { o.retention = d } }

// WithCatchUp makes a starting replica run the latest tick of the last d
// if no replica ran it (all of them were down at the time). Default 0:
// missed ticks are skipped.
func WithCatchUp(d time.Duration) Option { return func(o *options) { o.catchUp = d } }

// WithOverlap lets a tick run while the previous run still goes (each
// tick still runs once). Default: runs never overlap.
func WithOverlap() Option { return func(o *options) { o.overlap = true } }

// WithClock sets the replica's clock (default time.Now): for tests, and
// for replicas that keep time their own way.
func WithClock(now func() time.Time) Option { return func(o *options) { o.now = now } }

// WithOnError is called with each run's error (the tick then runs again
// on a replica that reaches it later, or waits for it), with the store's
// errors, and with ErrSkipped on the replica that skipped a tick. Default:
// none.
func WithOnError(fn func(Tick, error)) Option { return func(o *options) { o.onError = fn } }

// ErrSkipped is what a tick's record says when the previous run still
// held the job's lock when the tick's time was over (the tick after it,
// or a TTL after it if later; see the package documentation). It is
// reported to WithOnError once per skipped tick, on the replica that
// recorded it.
var ErrSkipped = errors.New("job: tick skipped: the previous run was still going")

// Run runs fn for every tick of sched under name, once per tick across the
// replicas that call Run with the same name on the same store, until ctx
// ends; it then returns ctx's error. fn's context ends when ctx does, and
// when the job's lock is lost. An error from fn (or a panic, turned into
// one) gives the tick back for another replica, and is passed to
// WithOnError.
//
// Ticks are instants every replica agrees on: sched is asked in UTC, so a
// robfig/cron schedule runs by UTC's clock whatever each replica's local
// zone, unless it names its own zone ("CRON_TZ=Europe/Paris 0 3 * * *"),
// and then by that zone's clock, daylight saving included.
func Run(ctx context.Context, store Store, name string, sched Schedule, fn func(ctx context.Context, t Tick) error, opts ...Option) error {
	o := options{ttl: 10 * time.Second, now: time.Now, onError: func(Tick, error) {}}
	for _, opt := range opts {
		opt(&o)
	}
	if o.retention == 0 {
		o.retention = max(10*time.Minute, 2*o.catchUp)
	}
	switch {
	case store == nil || sched == nil || fn == nil:
		return errors.New("job: Run needs a store, a schedule and a function")
	case name == "":
		return errors.New("job: the job has no name")
	case o.catchUp < 0 || o.now == nil || o.onError == nil:
		return errors.New("job: negative catch-up, or nil clock or error hook")
	case o.ttl <= 0:
		return fmt.Errorf("job: WithTTL(%s): the TTL must be positive", o.ttl)
	case o.retention <= o.catchUp:
		return fmt.Errorf("job: WithRetention(%s) must exceed the catch-up window (%s): a tick caught up must still be remembered as done", o.retention, o.catchUp)
	}
	if e, ok := sched.(every); ok && time.Duration(e) < time.Millisecond {
		return fmt.Errorf("job: Every(%s): the interval must be at least a millisecond", time.Duration(e))
	}
	g, err := idem.NewGuard(store, idem.WithTTL(o.ttl), idem.WithRetention(o.retention))
	if err != nil {
		return fmt.Errorf("job: %w", err)
	}
	m, err := lock.NewMutex(store, lock.WithTTL(o.ttl))
	if err != nil {
		return fmt.Errorf("job: %w", err)
	}
	r := &runner{name: name, sched: sched, fn: fn, o: o, guard: g, mutex: m}
	now := o.now()
	next, err := latest(r.next, now, o.catchUp)
	if err != nil {
		return err
	}
	if next.IsZero() {
		if next = r.next(now); next.IsZero() {
			return fmt.Errorf("job %s: the schedule has no tick after %s", name, now.UTC().Format(time.RFC3339))
		}
	}
	var runs sync.WaitGroup // WithOverlap: ticks run beside the loop
	defer runs.Wait()
	for !next.IsZero() {
		if err := r.sleepUntil(ctx, next); err != nil {
			return err
		}
		if o.overlap {
			at := next
			runs.Go(func() { r.tick(ctx, at) })
		} else {
			r.tick(ctx, next)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		// Every tick after this one is looked at in turn, also those that
		// came while this one ran or was waited for: one whose time is
		// over (its lock wait would have ended) is recorded skipped, once
		// across the replicas, unless another replica ran it; the others
		// run as usual, waiting for the lock until their time is over.
		next = r.next(next)
		for passed := 0; !next.IsZero() && !r.deadline(next).After(r.o.now()); passed++ {
			if passed == maxSkipRecords {
				// A replica that stood still (a paused process, a clock
				// that jumped): ticks past these are not recorded one by
				// one, but reported together, and the loop goes on from
				// the first tick whose time is not over.
				from := next
				next = r.firstLive(r.o.now())
				r.o.onError(Tick{Job: name, At: from.UTC()}, fmt.Errorf("%w: and the ticks after it until %s (this replica was behind)", ErrSkipped, next.UTC().Format(time.RFC3339Nano)))
				break
			}
			r.skip(ctx, next)
			if err := ctx.Err(); err != nil {
				return err
			}
			next = r.next(next)
		}
	}
	<-ctx.Done()
	return ctx.Err()
}

// maxSkipRecords bounds the ticks a replica records as skipped one by one
// when it finds their time over.
const maxSkipRecords = 1000

// maxScan bounds the Next calls of one search for a tick.
const maxScan = 1_000_000

// latest is the latest tick of next in (now-within, now], or zero. It
// looks back from now in doubling steps, so it finds the latest tick of a
// frequent schedule without walking every tick of the window.
func latest(next func(time.Time) time.Time, now time.Time, within time.Duration) (time.Time, error) {
	if within <= 0 {
		return time.Time{}, nil
	}
	var from time.Time
	for step := time.Millisecond; ; step *= 2 {
		from = now.Add(-min(step, within))
		if t := next(from); !t.IsZero() && !t.After(now) {
			break
		}
		if step >= within {
			return time.Time{}, nil // no tick in the window
		}
	}
	var last time.Time
	for t, n := next(from), 0; !t.IsZero() && !t.After(now); t, n = next(t), n+1 {
		if n == maxScan {
			return time.Time{}, fmt.Errorf("job: more than %d ticks in the last %s: the latest could not be found", maxScan, now.Sub(from))
		}
		last = t
	}
	return last, nil
}

type runner struct {
	name  string
	sched Schedule
	fn    func(context.Context, Tick) error
	o     options
	guard *idem.Guard
	mutex *lock.Mutex
}

// next is the schedule's first tick after t, asked in UTC (see Run).
func (r *runner) next(t time.Time) time.Time { return r.sched.Next(t.UTC()) }

// deadline is when the time of the tick at is over: the tick after it, or
// a TTL after it if that is later (a run that died holding the job's lock
// lets go of it within the TTL, and the tick must not be skipped for it).
// Until then a replica waits for the job's lock to run the tick; after
// it, the tick is skipped.
func (r *runner) deadline(at time.Time) time.Time {
	d := at.Add(r.o.ttl)
	if following := r.next(at); following.After(d) {
		return following
	}
	return d
}

// firstLive is the first tick whose time is not over at now: the latest
// tick at or before now, or the first one of the last TTL if earlier.
func (r *runner) firstLive(now time.Time) time.Time {
	first := r.next(now.Add(-r.o.ttl - time.Nanosecond))
	if last, err := latest(r.next, now, max(r.o.ttl, 24*time.Hour)); err == nil && !last.IsZero() && (first.IsZero() || last.Before(first)) {
		return last
	}
	if first.IsZero() {
		return r.next(now)
	}
	return first
}

// sleepUntil waits until the replica's clock reaches t. It looks at the
// clock again every second at most, so that a clock that jumps (or a test
// clock) is followed.
func (r *runner) sleepUntil(ctx context.Context, t time.Time) error {
	for {
		d := t.Sub(r.o.now())
		if d <= 0 {
			return nil
		}
		timer := time.NewTimer(min(d, time.Second))
		select {
		case <-ctx.Done():
			timer.Stop()
			return ctx.Err()
		case <-timer.C:
		}
	}
}

// Key is the stored key of a job's tick: the same on every replica.
func Key(job string, at time.Time) string {
	return idemdriver.ScopedKey("oncekit/job\x00"+job, at.UTC().Format(time.RFC3339Nano))
}

// LockKey is the key of the job's lock, which a run holds (unless
// WithOverlap): the same on every replica.
func LockKey(job string) string { return "oncekit/job/" + job }

// tick runs the tick at, once across the replicas.
func (r *runner) tick(ctx context.Context, at time.Time) {
	t := Tick{Job: r.name, At: at.UTC()}
	following := r.next(at)
	// A replica that finds the tick in flight waits for it (and takes it
	// over if its runner dies) until the tick after, and a TTL more.
	wait := r.o.ttl
	if !following.IsZero() {
		wait += max(0, following.Sub(r.o.now()))
	}
	// AnswersOnReturn: the tick's record must be complete when Do returns
	// (a run that committed its own transaction, sqlstore.InTx, would leave
	// it in flight and another replica would run the tick again), so
	// Commit refuses an effect the caller commits (idem.ErrCallerCommits).
	res, replayed, err := r.guard.Do(idemdriver.AnswersOnReturn(idemdriver.ContextWithWait(ctx, wait)), Key(r.name, at), r.name, func(ctx context.Context) ([]byte, error) {
		t.Attempt, _ = idem.AttemptFrom(ctx)
		if r.o.overlap {
			return []byte("ran"), r.call(ctx, t)
		}
		return r.locked(ctx, t)
	})
	switch {
	case err == nil && !replayed && string(res) == ErrSkipped.Error():
		r.o.onError(t, ErrSkipped) // this replica skipped it
	case err == nil, ctx.Err() != nil, errors.Is(err, idem.ErrInFlight): // done, shutting down, or still running elsewhere
	default:
		r.o.onError(t, err)
	}
}

// locked runs the tick under the job's lock, waiting for the previous run
// until the tick's time is over (deadline); a tick reached only then (a
// catch-up, a late replica) tries the lock once.
func (r *runner) locked(ctx context.Context, t Tick) ([]byte, error) {
	var h lock.Held
	var err error
	if wait := r.deadline(t.At).Sub(r.o.now()); wait > 0 {
		wctx, cancel := context.WithTimeout(ctx, wait)
		h, err = r.mutex.Lock(wctx, LockKey(r.name))
		cancel()
	} else {
		h, err = r.mutex.TryLock(ctx, LockKey(r.name))
	}
	if err != nil {
		if ctx.Err() == nil && errors.Is(err, lock.ErrNotAcquired) {
			return []byte(ErrSkipped.Error()), nil // stored: no replica runs this tick
		}
		return nil, err
	}
	defer func() {
		rctx, cancel := lockdriver.CleanupContext(ctx)
		defer cancel()
		_ = h.Release(rctx)
	}()
	rctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	go func() {
		select {
		case <-h.Lost():
			stop(lock.ErrLockLost)
		case <-rctx.Done():
		}
	}()
	t.Fence = h.Fence()
	if err := r.call(rctx, t); err != nil {
		return nil, err
	}
	if err := h.Err(); err != nil {
		return nil, err // the lock was lost while the run went on: not done
	}
	return []byte("ran"), nil
}

// skip records the tick at, whose time is over, as skipped — unless a
// replica ran it or runs it now — and reports it on the replica that
// recorded it.
func (r *runner) skip(ctx context.Context, at time.Time) {
	t := Tick{Job: r.name, At: at.UTC()}
	_, replayed, err := r.guard.Do(ctx, Key(r.name, at), r.name, func(context.Context) ([]byte, error) {
		return []byte(ErrSkipped.Error()), nil
	})
	switch {
	case err == nil && !replayed:
		r.o.onError(t, ErrSkipped)
	case err == nil, ctx.Err() != nil, errors.Is(err, idem.ErrInFlight):
	default:
		r.o.onError(t, err)
	}
}

// call runs the job's function, a panic turned into an error: a job must
// not take its replica down.
func (r *runner) call(ctx context.Context, t Tick) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("job %s: the run of %s panicked: %v", t.Job, t.At.Format(time.RFC3339Nano), p)
		}
	}()
	return r.fn(ctx, t)
}
