package idemtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/lock/lockdriver"
)

// Config describes the store under test.
type Config struct {
	// NewStore returns a Store on the backend under test; all Stores of
	// one Run must share it (clients of one server, or one in-process
	// store).
	NewStore func(t *testing.T) idemdriver.Store

	// Corrupt, when set, plants under key, through the real server, a
	// record the store did not write. Stores that cannot hold a foreign
	// record (in-process memory) leave it nil, and that subtest checks
	// nothing.
	Corrupt func(t *testing.T, key string)

	// FenceAtLeast says InspectRecord reports a fence at least the
	// claim's rather than exactly it: a quorum driver whose nodes each
	// keep their own fence (Redlock: the claim's fence is the highest of
	// the majority it waited for, and a node that answered later may keep
	// a higher one).
	FenceAtLeast bool

	// Effect, for a store that is an idemdriver.EffectStore, returns an effect
	// of the driver's type that adds one to a counter kept in the store
	// for key, refusing (with nothing written) once the counter reached
	// limit, and a function that reads the counter. Stores that are not
	// EffectStores leave it nil, and the effect subtests check that.
	Effect func(t *testing.T, key string, limit int) (effect any, count func() int)

	// Settle, for a quorum store (Redlock), waits until the requests st
	// left running in the background have ended: the nodes that answered
	// after the majority, whose writes could otherwise land after the
	// subtest's next step. The subtests that expect every node to have
	// seen a run call it after the run. Nil for a store with one server.
	Settle func(t *testing.T, st idemdriver.Store)

	// AttemptsMayRunHigh says a claim's Attempt may be one above the
	// count of claims that ended without completing, as idem's
	// documentation allows ("one too high, never too low"): a quorum
	// driver (Redlock) whose Begin that missed a majority gave its nodes
	// back counts that on them. Single-server stores leave it false and
	// are held to the exact count.
	AttemptsMayRunHigh bool

	// RunnerProcess says the driver's TestMain calls RunRunner, so that
	// the suite can kill a process in the middle of its run.
	RunnerProcess bool

	// ProcessEnv is added to the runner process's environment (it
	// inherits this process's): what RunRunner's constructor needs to
	// reach the store under test, for a suite that runs beside others on
	// other stores (in parallel, where t.Setenv is not allowed).
	ProcessEnv []string
}

// Run runs the whole suite.
func Run(t *testing.T, cfg Config) {
	t.Helper()
	s := &suite{cfg: cfg}
	t.Run("ExactlyOnceUnder64Duplicates", s.exactlyOnce)
	t.Run("Mismatch", s.mismatch)
	t.Run("AbandonThenRetry", s.abandonRetry)
	t.Run("CrashedClaimExpires", s.crashedExpires)
	t.Run("AttemptCountsEndedClaims", s.attempts)
	t.Run("KilledRunIsRetried", s.killedRun)
	t.Run("RetentionExpires", s.retention)
	t.Run("StaleHolderCannotTouchNewerClaim", s.staleHolder)
	t.Run("CorruptRecord", s.corrupt)
	t.Run("WaitForResult", s.waitForResult)
	t.Run("InFlightWithoutWaiting", s.inFlight)
	t.Run("FinalErrorsReplayed", s.finalErrors)
	t.Run("ResultTooLarge", s.tooLarge)
	t.Run("ClaimLostMidRun", s.lostMidRun)
	t.Run("RunEndsBeforeAnotherBegins", s.runEndsBeforeAnother)
	t.Run("PanicAbandons", s.panics)
	t.Run("GoexitAbandons", s.goexit)
	t.Run("CallerCancelKeepsClaim", s.callerCancel)
	t.Run("StoredKeyInRun", s.storedKey)
	t.Run("ClaimFencesIncreasePerKey", s.claimFences)
	t.Run("EffectCommitsWithRecord", s.effectCommits)
	t.Run("EffectRefusedWritesNothing", s.effectRefused)
	t.Run("EffectOnceAcrossCrash", s.effectAcrossCrash)
	t.Run("InvalidKey", s.invalidKey)
	t.Run("Inspect", s.inspect)
	t.Run("ListKeys", s.listKeys)
	t.Run("WatchdogKeepsLongRun", s.longRun)
	t.Run("Closed", s.closed) // last: NewStore may return one shared Store
}

type suite struct{ cfg Config }

func key(t *testing.T) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return idemdriver.ScopedKey("idemtest", strings.ReplaceAll(t.Name(), "/", ".")+"/"+hex.EncodeToString(b[:]))
}

// settle waits for st's late node requests (Config.Settle).
func (s *suite) settle(t *testing.T, st idemdriver.Store) {
	t.Helper()
	if s.cfg.Settle != nil {
		s.cfg.Settle(t, st)
	}
}

func guard(t *testing.T, st idemdriver.Store, opts ...idem.Option) *idem.Guard {
	t.Helper()
	g, err := idem.NewGuard(st, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

func (s *suite) exactlyOnce(t *testing.T) {
	k := key(t)
	var runs atomic.Int64
	stores := []idemdriver.Store{s.cfg.NewStore(t), s.cfg.NewStore(t), s.cfg.NewStore(t), s.cfg.NewStore(t)}
	results := make([][]byte, 64)
	replays := make([]bool, 64)
	errs := make([]error, 64)
	var wg sync.WaitGroup
	ctx := ctxT(t, 30*time.Second)
	for i := range 64 {
		g := guard(t, stores[i%len(stores)], idem.WithWait(20*time.Second))
		wg.Go(func() {
			results[i], replays[i], errs[i] = g.Do(ctx, k, "fp", func(ctx context.Context) ([]byte, error) {
				n := runs.Add(1)
				time.Sleep(20 * time.Millisecond) // duplicates arrive while it runs
				return fmt.Appendf(nil, "order-%d", n), nil
			})
		})
	}
	wg.Wait()
	if n := runs.Load(); n != 1 {
		t.Fatalf("run executed %d times, want 1", n)
	}
	fresh := 0
	for i := range 64 {
		if errs[i] != nil {
			t.Fatalf("duplicate %d: %v", i, errs[i])
		}
		if string(results[i]) != "order-1" {
			t.Errorf("duplicate %d got %q, want %q", i, results[i], "order-1")
		}
		if !replays[i] {
			fresh++
		}
	}
	if fresh != 1 {
		t.Errorf("%d callers saw a fresh result, want 1 (the others replayed)", fresh)
	}
}

func (s *suite) mismatch(t *testing.T) {
	k := key(t)
	st := s.cfg.NewStore(t)
	ctx := ctxT(t, 5*time.Second)
	c, err := st.Begin(ctx, idemdriver.MustKey(k), "fp-a", 10*time.Second)
	if err != nil || c.State != idemdriver.Acquired {
		t.Fatalf("Begin: %v %v", c.State, err)
	}
	if d, err := st.Begin(ctx, idemdriver.MustKey(k), "fp-b", 10*time.Second); err != nil || d.State != idemdriver.Mismatch {
		t.Errorf("Begin with another fingerprint while in flight: %v %v, want mismatch", d.State, err)
	}
	if err := st.Complete(ctx, c, []byte("x"), time.Minute); err != nil {
		t.Fatal(err)
	}
	_, _, err = guard(t, st).Do(ctx, k, "fp-b", func(context.Context) ([]byte, error) {
		t.Error("run executed for a reused key")
		return nil, nil
	})
	if !errors.Is(err, idem.ErrMismatch) {
		t.Errorf("Do with another fingerprint after completion: %v, want ErrMismatch", err)
	}
}

func (s *suite) abandonRetry(t *testing.T) {
	k := key(t)
	g := guard(t, s.cfg.NewStore(t))
	ctx := ctxT(t, 5*time.Second)
	var runs atomic.Int64
	boom := errors.New("transient")
	if _, _, err := g.Do(ctx, k, "fp", func(context.Context) ([]byte, error) { runs.Add(1); return nil, boom }); !errors.Is(err, boom) {
		t.Fatalf("first Do: %v, want the run's error", err)
	}
	res, replayed, err := g.Do(ctx, k, "fp", func(context.Context) ([]byte, error) { runs.Add(1); return []byte("ok"), nil })
	if err != nil || replayed || string(res) != "ok" || runs.Load() != 2 {
		t.Errorf("retry after a failed run: %q replayed=%v err=%v runs=%d; want a fresh run", res, replayed, err, runs.Load())
	}
}

func (s *suite) crashedExpires(t *testing.T) {
	k := key(t)
	st := s.cfg.NewStore(t)
	ctx := ctxT(t, 10*time.Second)
	// (Half a second: Redlock reads a lease of 100 ms that a loaded
	// machine answered 60 ms late as node clocks that disagree.)
	if c, err := st.Begin(ctx, idemdriver.MustKey(k), "fp", 500*time.Millisecond); err != nil || c.State != idemdriver.Acquired {
		t.Fatalf("Begin: %v %v", c.State, err)
	}
	// The holder crashes: no Complete, no Abandon.
	time.Sleep(700 * time.Millisecond)
	res, replayed, err := guard(t, s.cfg.NewStore(t)).Do(ctx, k, "fp", func(context.Context) ([]byte, error) { return []byte("rerun"), nil })
	if err != nil || replayed || string(res) != "rerun" {
		t.Errorf("Do after the crashed claim's lease: %q replayed=%v err=%v; want a fresh run", res, replayed, err)
	}
}

// attempts: a claim after claims that ended without completing (a lease
// that ran out, an abandon) carries their count plus one; a completion
// starts the count again.
func (s *suite) attempts(t *testing.T) {
	k := key(t)
	st := s.cfg.NewStore(t)
	ctx := ctxT(t, 20*time.Second)
	begin := func(lease time.Duration, want int) idemdriver.Claim {
		t.Helper()
		c, err := st.Begin(ctx, idemdriver.MustKey(k), "fp", lease)
		// A crashed claim ends by the store's own clock or timer, which a
		// loaded machine may run late: look again for a while.
		for deadline := time.Now().Add(10 * time.Second); err == nil && c.State == idemdriver.InFlight && time.Now().Before(deadline); {
			time.Sleep(50 * time.Millisecond)
			c, err = st.Begin(ctx, idemdriver.MustKey(k), "fp", lease)
		}
		if err != nil || c.State != idemdriver.Acquired {
			t.Fatalf("Begin: %v %v, want acquired", c.State, err)
		}
		if !s.attemptOK(c.Attempt, want) {
			t.Errorf("claim's Attempt %d, want %d", c.Attempt, want)
		}
		return c
	}
	other := s.cfg.NewStore(t) // (made, and its connection dialled, before the claim's lease runs)
	if _, err := other.Begin(ctx, idemdriver.MustKey(key(t)), "fp", time.Second); err != nil {
		t.Fatal(err)
	}
	first := begin(time.Second, 1)
	if d, err := other.Begin(ctx, idemdriver.MustKey(k), "fp", time.Second); err != nil || d.State != idemdriver.InFlight || d.Attempt != 0 {
		t.Errorf("a duplicate's Begin: %v attempt %d %v, want in flight, attempt 0", d.State, d.Attempt, err)
	}
	// The holder crashed: no Complete, no Abandon; begin looks until its
	// lease has run out.
	second := begin(10*time.Second, 2)
	if second.Fence <= first.Fence {
		t.Errorf("the second claim's fence %d not above the first's %d", second.Fence, first.Fence)
	}
	if err := st.Abandon(ctx, second); err != nil {
		t.Fatal(err)
	}
	s.settle(t, st)
	var seen []int
	run := func(ctx context.Context) ([]byte, error) {
		n, ok := idem.AttemptFrom(ctx)
		if !ok {
			t.Error("no attempt in the run's context")
		}
		seen = append(seen, n)
		return []byte("ok"), nil
	}
	gst := s.cfg.NewStore(t)
	g := guard(t, gst, idem.WithRetention(time.Second)) // (the duplicate comes within it)
	if _, _, err := g.Do(ctx, k, "fp", run); err != nil {
		t.Fatal(err)
	}
	s.settle(t, gst)
	if _, replayed, err := g.Do(ctx, k, "fp", run); err != nil || !replayed {
		t.Fatalf("a duplicate after completion: replayed=%v %v", replayed, err)
	}
	s.settle(t, gst)
	time.Sleep(1500 * time.Millisecond) // the result's retention ends: a new request
	if _, _, err := g.Do(ctx, k, "fp", run); err != nil {
		t.Fatal(err)
	}
	if want := []int{3, 1}; len(seen) != len(want) || !s.attemptOK(seen[0], want[0]) || !s.attemptOK(seen[1], want[1]) {
		t.Errorf("runs saw attempts %v, want %v (after a crash and an abandon; after the completed record's retention)", seen, want)
	}
}

// attemptOK reports whether a claim's attempt got is right where want is
// the exact count: one above it too when the driver may count high.
func (s *suite) attemptOK(got, want int) bool {
	return got == want || s.cfg.AttemptsMayRunHigh && got == want+1
}

func (s *suite) retention(t *testing.T) {
	k := key(t)
	// (A second: a duplicate sent at once must come within it on a loaded
	// machine too.)
	g := guard(t, s.cfg.NewStore(t), idem.WithRetention(time.Second))
	ctx := ctxT(t, 10*time.Second)
	var runs atomic.Int64
	run := func(context.Context) ([]byte, error) { return fmt.Appendf(nil, "%d", runs.Add(1)), nil }
	if _, _, err := g.Do(ctx, k, "fp", run); err != nil {
		t.Fatal(err)
	}
	if res, replayed, err := g.Do(ctx, k, "fp", run); err != nil || !replayed || string(res) != "1" {
		t.Errorf("within retention: %q replayed=%v err=%v; want the replay of 1", res, replayed, err)
	}
	time.Sleep(1500 * time.Millisecond)
	if res, replayed, err := g.Do(ctx, k, "fp", run); err != nil || replayed || string(res) != "2" {
		t.Errorf("after retention: %q replayed=%v err=%v; want a fresh run", res, replayed, err)
	}
}

func (s *suite) staleHolder(t *testing.T) {
	k := key(t)
	st := s.cfg.NewStore(t)
	ctx := ctxT(t, 10*time.Second)
	old, err := st.Begin(ctx, idemdriver.MustKey(k), "fp", 100*time.Millisecond)
	if err != nil || old.State != idemdriver.Acquired {
		t.Fatalf("Begin: %v %v", old.State, err)
	}
	time.Sleep(200 * time.Millisecond)
	cur, err := s.cfg.NewStore(t).Begin(ctx, idemdriver.MustKey(k), "fp", 10*time.Second)
	if err != nil || cur.State != idemdriver.Acquired {
		t.Fatalf("Begin after the lease: %v %v", cur.State, err)
	}
	if cur.Fence <= old.Fence {
		t.Errorf("new claim's fence %d not above the old one's %d", cur.Fence, old.Fence)
	}
	if err := st.Complete(ctx, old, []byte("stale"), time.Minute); !errors.Is(err, lock.ErrLockLost) {
		t.Errorf("stale Complete: %v, want ErrLockLost", err)
	}
	if err := st.Abandon(ctx, old); !errors.Is(err, lock.ErrLockLost) {
		t.Errorf("stale Abandon: %v, want ErrLockLost", err)
	}
	if err := st.Extend(ctx, old, time.Minute); !errors.Is(err, lock.ErrLockLost) {
		t.Errorf("stale Extend: %v, want ErrLockLost", err)
	}
	if c, err := st.Begin(ctx, idemdriver.MustKey(k), "fp", time.Second); err != nil || c.State != idemdriver.InFlight {
		t.Errorf("the newer claim after the stale calls: %v %v, want in flight", c.State, err)
	}
	if err := st.Complete(ctx, cur, []byte("fresh"), time.Minute); err != nil {
		t.Fatalf("newer claim's Complete: %v", err)
	}
	if c, err := st.Begin(ctx, idemdriver.MustKey(k), "fp", time.Second); err != nil || c.State != idemdriver.Completed || string(c.Result) != "fresh" {
		t.Errorf("after Complete: %v %q %v", c.State, c.Result, err)
	}
}

func (s *suite) corrupt(t *testing.T) {
	if s.cfg.Corrupt == nil {
		return // an in-process store holds no foreign records
	}
	k := key(t)
	s.cfg.Corrupt(t, k)
	st := s.cfg.NewStore(t)
	_, err := st.Begin(ctxT(t, 5*time.Second), idemdriver.MustKey(k), "fp", time.Second)
	if ck, _, ok := idemdriver.CorruptRecordOf(err); !errors.Is(err, idem.ErrCorruptRecord) || !ok || ck != k {
		t.Fatalf("Begin on a corrupt record: %v, want a CorruptRecord naming the key", err)
	}
	_, _, err = guard(t, st).Do(ctxT(t, 5*time.Second), k, "fp", func(context.Context) ([]byte, error) {
		t.Error("run executed over a corrupt record")
		return nil, nil
	})
	if !errors.Is(err, idem.ErrCorruptRecord) {
		t.Errorf("Do on a corrupt record: %v, want ErrCorruptRecord", err)
	}
}

// awaitRun waits until a Do in another goroutine is running its function
// (started closes), failing the test if that Do ended without running it
// (a store error) or nothing happened in 10 s.
func awaitRun(t *testing.T, started <-chan struct{}, ended <-chan error) {
	t.Helper()
	select {
	case <-started:
	case err := <-ended:
		t.Fatalf("Do ended without running: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("Do did not start running within 10 s")
	}
}

func (s *suite) waitForResult(t *testing.T) {
	k := key(t)
	ctx := ctxT(t, 10*time.Second)
	release := make(chan struct{})
	started := make(chan struct{})
	first := make(chan error, 1)
	go func() {
		_, _, err := guard(t, s.cfg.NewStore(t)).Do(ctx, k, "fp", func(context.Context) ([]byte, error) {
			close(started)
			<-release
			return []byte("late"), nil
		})
		first <- err
	}()
	awaitRun(t, started, first)
	second := make(chan struct{})
	var res []byte
	var replayed bool
	var err error
	go func() {
		defer close(second)
		res, replayed, err = guard(t, s.cfg.NewStore(t), idem.WithWait(8*time.Second)).Do(ctx, k, "fp", func(context.Context) ([]byte, error) {
			t.Error("the waiting duplicate ran")
			return nil, nil
		})
	}()
	close(release)
	<-second
	if err := <-first; err != nil {
		t.Fatalf("first Do: %v", err)
	}
	if err != nil || !replayed || string(res) != "late" {
		t.Errorf("waiting duplicate: %q replayed=%v err=%v; want the replay of %q", res, replayed, err, "late")
	}
}

func (s *suite) inFlight(t *testing.T) {
	k := key(t)
	st := s.cfg.NewStore(t)
	ctx := ctxT(t, 5*time.Second)
	if c, err := st.Begin(ctx, idemdriver.MustKey(k), "fp", 10*time.Second); err != nil || c.State != idemdriver.Acquired {
		t.Fatalf("Begin: %v %v", c.State, err)
	}
	_, _, err := guard(t, s.cfg.NewStore(t)).Do(ctx, k, "fp", func(context.Context) ([]byte, error) {
		t.Error("a duplicate ran while the first was in flight")
		return nil, nil
	})
	if after, ok := idemdriver.RetryAfter(err); !errors.Is(err, idem.ErrInFlight) || !ok || after <= 0 || after > 10*time.Second {
		t.Errorf("duplicate in flight: %v, want ErrInFlight with a retry hint in (0, 10s]", err)
	}
}

var errInvalid = errors.New("invalid order")

func (s *suite) finalErrors(t *testing.T) {
	k := key(t)
	g := guard(t, s.cfg.NewStore(t), idem.WithFinalErrors(func(err error) bool { return errors.Is(err, errInvalid) }))
	ctx := ctxT(t, 5*time.Second)
	var runs atomic.Int64
	run := func(context.Context) ([]byte, error) { runs.Add(1); return nil, fmt.Errorf("sku 7: %w", errInvalid) }
	if _, _, err := g.Do(ctx, k, "fp", run); !errors.Is(err, errInvalid) {
		t.Fatalf("first Do: %v, want the run's own error", err)
	}
	_, replayed, err := g.Do(ctx, k, "fp", run)
	if err == nil || err.Error() != "sku 7: invalid order" || !replayed || runs.Load() != 1 {
		t.Errorf("duplicate of a final error: %v replayed=%v runs=%d; want the stored error replayed", err, replayed, runs.Load())
	}
}

func (s *suite) tooLarge(t *testing.T) {
	k := key(t)
	g := guard(t, s.cfg.NewStore(t), idem.WithMaxResult(10))
	ctx := ctxT(t, 5*time.Second)
	if _, _, err := g.Do(ctx, k, "fp", func(context.Context) ([]byte, error) { return []byte("0123456789A"), nil }); !errors.Is(err, idem.ErrResultTooLarge) {
		t.Fatalf("11-byte result with a 10-byte limit: %v, want ErrResultTooLarge", err)
	}
	if res, replayed, err := g.Do(ctx, k, "fp", func(context.Context) ([]byte, error) { return []byte("0123456789"), nil }); err != nil || replayed || string(res) != "0123456789" {
		t.Errorf("retry with a result at the limit: %q replayed=%v err=%v", res, replayed, err)
	}
}

// lostMidRun cuts the run's store off from extending its claim (as in a
// partition): the lease runs out, the run's context is cancelled with
// ErrLockLost, and its result is not stored.
func (s *suite) lostMidRun(t *testing.T) {
	k := key(t)
	st := s.cfg.NewStore(t)
	g := guard(t, noExtend{st}, idem.WithTTL(150*time.Millisecond))
	ctx := ctxT(t, 10*time.Second)
	var cause error
	_, _, err := g.Do(ctx, k, "fp", func(ctx context.Context) ([]byte, error) {
		select {
		case <-ctx.Done():
			cause = context.Cause(ctx)
		case <-time.After(5 * time.Second):
		}
		return []byte("too late"), nil
	})
	if !errors.Is(err, lock.ErrLockLost) || !errors.Is(cause, lock.ErrLockLost) {
		t.Fatalf("Do with a lost claim: %v (run's cause %v), want ErrLockLost", err, cause)
	}
	// The run ends a little before its claim expires in the store: wait
	// for the key to come free.
	res, replayed, err := guard(t, s.cfg.NewStore(t), idem.WithWait(5*time.Second)).Do(ctx, k, "fp", func(context.Context) ([]byte, error) { return []byte("again"), nil })
	if err != nil || replayed || string(res) != "again" {
		t.Errorf("after a lost claim: %q replayed=%v err=%v; want a fresh run (nothing stored)", res, replayed, err)
	}
}

// runEndsBeforeAnother: a run whose store stops answering its extensions
// (they hang, as over a cut connection) has its context ended by the
// Guard's own timer before the claim can run out in the store, so before
// another process's Begin can succeed: never two runs at once. The first
// extension goes through, so the validity it grants is the one counted.
func (s *suite) runEndsBeforeAnother(t *testing.T) {
	cut := &hangingExtend{Store: s.cfg.NewStore(t), after: 1}
	CheckRunEndsBeforeAnother(t, cut, s.cfg.NewStore(t), func() {})
	if n := cut.extended.Load(); n < 1 {
		t.Errorf("%d extensions went through before the cut, want 1", n)
	}
}

// CheckRunEndsBeforeAnother runs a Guard (lease 1.2 s) over via, and half a
// lease into the run — after its first extension — calls cut, which must
// cut via off from its store (a stalled connection, a paused proxy; or
// nothing, when via's extensions hang by themselves from then on). It
// checks that the run's context is done before a Begin on other (another
// process's Store of the same servers) can claim the key, and that Do then
// reports lock.ErrLockLost: never two runs at once.
func CheckRunEndsBeforeAnother(t *testing.T, via, other idemdriver.Store, cut func()) {
	t.Helper()
	k := key(t)
	const lease = 1200 * time.Millisecond
	g := guard(t, via, idem.WithTTL(lease))
	ctx := ctxT(t, 20*time.Second)
	started := make(chan struct{})
	ended := make(chan time.Time, 1)
	runErr := make(chan error, 1)
	go func() {
		_, _, err := g.Do(ctx, k, "fp", func(rctx context.Context) ([]byte, error) {
			close(started)
			select {
			case <-rctx.Done():
				ended <- time.Now()
			case <-ctx.Done():
			}
			return []byte("late"), nil
		})
		runErr <- err
	}()
	<-started
	time.Sleep(lease / 2) // one extension, at lease/3
	cut()
	var began time.Time
	for began.IsZero() {
		c, err := other.Begin(ctx, idemdriver.MustKey(k), "fp", lease)
		switch {
		case err != nil:
			t.Fatalf("another process's Begin: %v", err)
		case c.State == idemdriver.Acquired:
			began = time.Now()
			defer other.Abandon(context.Background(), c)
		default:
			time.Sleep(time.Millisecond)
		}
	}
	select {
	case end := <-ended:
		t.Logf("the cut-off run ended %s before another process claimed the key", began.Sub(end).Round(time.Millisecond))
	default:
		t.Fatal("another process claimed the key while the cut-off run was still going: two runs at once")
	}
	if err := <-runErr; !errors.Is(err, lock.ErrLockLost) {
		t.Errorf("Do whose claim ran out: %v, want ErrLockLost", err)
	}
}

// hangingExtend lets the first after extensions through, then hangs every
// later one until its context ends.
type hangingExtend struct {
	idemdriver.Store
	after    int64
	extended atomic.Int64
}

func (h *hangingExtend) Extend(ctx context.Context, c idemdriver.Claim, ttl time.Duration) error {
	if h.extended.Load() < h.after {
		if err := h.Store.Extend(ctx, c, ttl); err != nil {
			return err
		}
		h.extended.Add(1)
		return nil
	}
	<-ctx.Done()
	return ctx.Err()
}

type noExtend struct{ idemdriver.Store }

func (noExtend) Extend(ctx context.Context, _ idemdriver.Claim, _ time.Duration) error {
	<-ctx.Done()
	return ctx.Err()
}

func (s *suite) panics(t *testing.T) {
	k := key(t)
	g := guard(t, s.cfg.NewStore(t))
	ctx := ctxT(t, 5*time.Second)
	func() {
		defer func() {
			if recover() == nil {
				t.Error("the run's panic did not propagate")
			}
		}()
		_, _, _ = g.Do(ctx, k, "fp", func(context.Context) ([]byte, error) { panic("boom") })
	}()
	if res, _, err := g.Do(ctx, k, "fp", func(context.Context) ([]byte, error) { return []byte("ok"), nil }); err != nil || string(res) != "ok" {
		t.Errorf("retry after a panic: %q %v; want a fresh run", res, err)
	}
}

// goexit: a run that calls runtime.Goexit (t.FailNow in a test helper,
// say) gives its key back at once, not at the end of its lease.
func (s *suite) goexit(t *testing.T) {
	k := key(t)
	st := s.cfg.NewStore(t)
	g := guard(t, st, idem.WithTTL(time.Minute))
	ctx := ctxT(t, 10*time.Second)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _, _ = g.Do(ctx, k, "fp", func(context.Context) ([]byte, error) {
			runtime.Goexit()
			return nil, nil
		})
	}()
	<-done
	c, err := st.Begin(ctx, idemdriver.MustKey(k), "fp", time.Second)
	if err != nil || c.State != idemdriver.Acquired {
		t.Fatalf("Begin after a run that called Goexit: %v %v; want Acquired (the claim abandoned)", c.State, err)
	}
	_ = st.Abandon(ctx, c)
}

// callerCancel: the caller's context ends while the run goes on (a client
// that hung up): the claim must stay alive until the run returns, so that
// a retry arriving after the lease would have run out finds it in flight
// instead of running concurrently.
func (s *suite) callerCancel(t *testing.T) {
	// Two seconds: extensions every third of it must reach the store in
	// time on a machine busy with every package's tests (at 300 ms, one
	// that came 200 ms late on etcd lost the claim; at 1 s, one behind
	// pgbouncer during a parallel run).
	const lease = 2 * time.Second
	k := key(t)
	g := guard(t, s.cfg.NewStore(t), idem.WithTTL(lease))
	callerCtx, hangUp := context.WithCancel(ctxT(t, 10*time.Second))
	var running, runs atomic.Int32
	release := make(chan struct{})
	first := make(chan error, 1)
	go func() {
		_, _, err := g.Do(callerCtx, k, "fp", func(context.Context) ([]byte, error) {
			runs.Add(1)
			running.Add(1)
			defer running.Add(-1)
			<-release // the handler ignores its context, as many do
			return []byte("first"), nil
		})
		first <- err
	}()
	time.Sleep(lease / 3)
	hangUp()
	time.Sleep(2 * lease) // past the lease, had extension stopped
	_, _, err := g.Do(ctxT(t, 5*time.Second), k, "fp", func(context.Context) ([]byte, error) {
		runs.Add(1)
		if running.Load() > 0 {
			t.Error("the retry ran while the first run was still running")
		}
		return []byte("retry"), nil
	})
	if !errors.Is(err, idem.ErrInFlight) {
		t.Errorf("retry while the first run goes on: %v; want ErrInFlight", err)
	}
	close(release)
	if err := <-first; err != nil {
		t.Errorf("first run: %v", err)
	}
	res, replayed, err := g.Do(ctxT(t, 5*time.Second), k, "fp", func(context.Context) ([]byte, error) {
		runs.Add(1)
		return []byte("late"), nil
	})
	if err != nil || !replayed || string(res) != "first" {
		t.Errorf("after the first run: %q replayed=%v %v; want the first run's result replayed", res, replayed, err)
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("%d runs, want 1", n)
	}
}

// storedKey: the run reads its claim's stored key from its context, the
// same on every retry.
func (s *suite) storedKey(t *testing.T) {
	k := key(t)
	g := guard(t, s.cfg.NewStore(t))
	var got string
	_, _, err := g.Do(ctxT(t, 5*time.Second), k, "fp", func(ctx context.Context) ([]byte, error) {
		got, _ = idem.KeyFrom(ctx)
		return nil, nil
	})
	if err != nil || got != k {
		t.Errorf("KeyFrom in the run = %q (%v), want %q", got, err, k)
	}
	if _, ok := idem.KeyFrom(context.Background()); ok {
		t.Error("KeyFrom outside a run reported a key")
	}
}

// claimFences: the claims of one key get strictly increasing fences, also
// across Stores (processes). Fences are per key: nothing is promised
// between keys.
func (s *suite) claimFences(t *testing.T) {
	k := key(t)
	ctx := ctxT(t, 10*time.Second)
	var last uint64
	for i := range 4 {
		st := s.cfg.NewStore(t)
		c, err := st.Begin(ctx, idemdriver.MustKey(k), "fp", 5*time.Second)
		if err != nil || c.State != idemdriver.Acquired {
			t.Fatalf("claim %d: %v %v", i, c.State, err)
		}
		if c.Fence <= last {
			t.Fatalf("claim %d: fence %d not above the previous claim's %d", i, c.Fence, last)
		}
		last = c.Fence
		if err := st.Abandon(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
}

// effectStore returns the store under test as an EffectStore, or checks
// that a store without Config.Effect is none and reports false.
func (s *suite) effectStore(t *testing.T) (idemdriver.EffectStore, bool) {
	st := s.cfg.NewStore(t)
	es, ok := st.(idemdriver.EffectStore)
	if s.cfg.Effect == nil {
		if ok {
			t.Fatalf("%T is an idemdriver.EffectStore but Config.Effect is not set", st)
		}
		g := guard(t, st)
		_, _, err := g.Do(ctxT(t, 5*time.Second), key(t), "fp", func(ctx context.Context) ([]byte, error) {
			return nil, idem.Commit(ctx, struct{}{})
		})
		if !errors.Is(err, idem.ErrEffectUnsupported) {
			t.Errorf("an effect on a store that cannot commit one: %v, want ErrEffectUnsupported", err)
		}
		return nil, false
	}
	if !ok {
		t.Fatalf("Config.Effect is set but %T is not an idemdriver.EffectStore", st)
	}
	return es, true
}

// effectCommits: a run's effect and its record commit together, once; a
// duplicate replays without applying the effect again.
func (s *suite) effectCommits(t *testing.T) {
	es, ok := s.effectStore(t)
	if !ok {
		return
	}
	k := key(t)
	effect, count := s.cfg.Effect(t, k, 10)
	g := guard(t, es)
	ctx := ctxT(t, 10*time.Second)
	for i := range 3 {
		res, replayed, err := g.Do(ctx, k, "fp", func(ctx context.Context) ([]byte, error) {
			if err := idem.Commit(ctx, effect); err != nil {
				return nil, err
			}
			if err := idem.Commit(ctx, effect); err == nil {
				t.Error("a second Commit in one run was accepted")
			}
			return []byte("ordered"), nil
		})
		if err != nil || string(res) != "ordered" || replayed != (i > 0) {
			t.Fatalf("Do #%d: %q replayed=%v %v", i, res, replayed, err)
		}
	}
	if n := count(); n != 1 {
		t.Errorf("effect applied %d times, want 1", n)
	}
	if err := idem.Commit(ctx, effect); err == nil {
		t.Error("Commit outside a run was accepted")
	}
}

// effectRefused: an effect whose own check fails writes nothing, the
// record is not completed (the claim is dropped), and Do says why.
func (s *suite) effectRefused(t *testing.T) {
	es, ok := s.effectStore(t)
	if !ok {
		return
	}
	k := key(t)
	effect, count := s.cfg.Effect(t, k, 0)
	g := guard(t, es)
	ctx := ctxT(t, 10*time.Second)
	_, _, err := g.Do(ctx, k, "fp", func(ctx context.Context) ([]byte, error) {
		return []byte("ordered"), idem.Commit(ctx, effect)
	})
	if !errors.Is(err, idem.ErrEffectRefused) {
		t.Fatalf("Do with a refused effect: %v, want ErrEffectRefused", err)
	}
	if n := count(); n != 0 {
		t.Errorf("a refused effect wrote: counter %d", n)
	}
	c, err := es.Begin(ctx, idemdriver.MustKey(k), "fp", time.Second)
	if err != nil || c.State != idemdriver.Acquired {
		t.Fatalf("Begin after a refused effect: %v %v; want the key free again", c.State, err)
	}
	_ = es.Abandon(ctx, c)
}

// effectAcrossCrash: a process that claimed the key and died before its
// commit left nothing; the retry after the lease applies the effect once,
// and the dead process's late commit (it was only paused) is refused. A
// commit repeated after a lost reply applies nothing more.
func (s *suite) effectAcrossCrash(t *testing.T) {
	es, ok := s.effectStore(t)
	if !ok {
		return
	}
	k := key(t)
	effect, count := s.cfg.Effect(t, k, 10)
	ctx := ctxT(t, 10*time.Second)
	crashed, err := es.Begin(ctx, idemdriver.MustKey(k), "fp", 300*time.Millisecond)
	if err != nil || crashed.State != idemdriver.Acquired {
		t.Fatalf("Begin: %v %v", crashed.State, err)
	}
	time.Sleep(400 * time.Millisecond) // its lease runs out
	retry, err := es.Begin(ctx, idemdriver.MustKey(k), "fp", 10*time.Second)
	if err != nil || retry.State != idemdriver.Acquired {
		t.Fatalf("Begin after the lease: %v %v", retry.State, err)
	}
	if err := es.CompleteWith(ctx, retry, []byte("r"), time.Minute, effect); err != nil {
		t.Fatalf("CompleteWith: %v", err)
	}
	if err := es.CompleteWith(ctx, retry, []byte("r"), time.Minute, effect); err != nil && !errors.Is(err, lock.ErrLockLost) {
		t.Errorf("CompleteWith repeated after its reply was lost: %v, want nil or ErrLockLost", err)
	}
	if err := es.CompleteWith(ctx, crashed, []byte("late"), time.Minute, effect); !errors.Is(err, lock.ErrLockLost) {
		t.Errorf("the stale claim's CompleteWith: %v, want ErrLockLost", err)
	}
	if n := count(); n != 1 {
		t.Errorf("effect applied %d times across a crash, a retry and a stale commit; want 1", n)
	}
	if c, err := es.Begin(ctx, idemdriver.MustKey(k), "fp", time.Second); err != nil || c.State != idemdriver.Completed || string(c.Result) != "r" {
		t.Errorf("Begin after the commit: %v %q %v; want the result replayed", c.State, c.Result, err)
	}
}

func (s *suite) invalidKey(t *testing.T) {
	st := s.cfg.NewStore(t)
	ctx := ctxT(t, 5*time.Second)
	if _, err := st.Begin(ctx, idemdriver.Key{}, "fp", time.Second); !errors.Is(err, lock.ErrInvalidKey) {
		t.Errorf("Begin with the zero Key: %v, want ErrInvalidKey", err)
	}
	for _, k := range []string{"", strings.Repeat("k", 513)} {
		if _, err := idemdriver.CheckKey(k); !errors.Is(err, lock.ErrInvalidKey) {
			t.Errorf("CheckKey of a %d-byte key: %v, want ErrInvalidKey", len(k), err)
		}
		if _, _, err := guard(t, st).Do(ctx, k, "fp", nil); !errors.Is(err, lock.ErrInvalidKey) {
			t.Errorf("Do with a %d-byte key: %v, want ErrInvalidKey", len(k), err)
		}
	}
}

// inspect checks idemdriver.Inspector, which every oncekit driver implements.
func (s *suite) inspect(t *testing.T) {
	st := s.cfg.NewStore(t)
	in, ok := st.(idemdriver.Inspector)
	if !ok {
		t.Fatalf("%T does not implement idemdriver.Inspector", st)
	}
	ctx := ctxT(t, 10*time.Second)
	k := key(t)
	if _, err := in.InspectRecord(ctx, ""); !errors.Is(err, lock.ErrInvalidKey) {
		t.Errorf("InspectRecord(\"\"): %v, want ErrInvalidKey", err)
	}
	if info, err := in.InspectRecord(ctx, k); err != nil || info.Found {
		t.Fatalf("InspectRecord of a missing key = %+v, %v", info, err)
	}
	c, err := st.Begin(ctx, idemdriver.MustKey(k), "fp-1", 5*time.Second)
	if err != nil || c.State != idemdriver.Acquired {
		t.Fatalf("Begin: %v %v", c.State, err)
	}
	info, err := in.InspectRecord(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	fenceOK := info.Fence == c.Fence || (s.cfg.FenceAtLeast && info.Fence > c.Fence)
	if !info.Found || info.State != idemdriver.InFlight || !fenceOK || info.Fingerprint != "fp-1" ||
		info.Token != lockdriver.TokenPrefix(c.Token) || time.Until(info.Expires) <= 0 || time.Until(info.Expires) > 6*time.Second {
		t.Errorf("in flight: %+v; want fence %d, token %s", info, c.Fence, lockdriver.TokenPrefix(c.Token))
	}

	// Deleting an in-flight record: the run's claim is lost, a retry runs.
	if ok, err := in.DeleteRecord(ctx, k); err != nil || !ok {
		t.Fatalf("DeleteRecord = %v, %v", ok, err)
	}
	if err := st.Complete(ctx, c, []byte("late"), time.Minute); !errors.Is(err, lock.ErrLockLost) {
		t.Errorf("Complete after DeleteRecord: %v, want ErrLockLost", err)
	}
	res, replayed, err := guard(t, st).Do(ctx, k, "fp-1", func(context.Context) ([]byte, error) { return []byte("done"), nil })
	if err != nil || replayed || string(res) != "done" {
		t.Fatalf("Do after DeleteRecord = %q %v %v", res, replayed, err)
	}
	s.settle(t, st)
	info, err = in.InspectRecord(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	got, final, derr := idem.RecordOutcome(info)
	if !info.Found || info.State != idemdriver.Completed || info.Fence <= c.Fence || string(got) != "done" || final != nil || derr != nil {
		t.Errorf("completed: %+v, outcome %q %v %v", info, got, final, derr)
	}
	if ok, err := in.DeleteRecord(ctx, k); err != nil || !ok {
		t.Fatalf("DeleteRecord of a completed record = %v, %v", ok, err)
	}
	if ok, err := in.DeleteRecord(ctx, k); err != nil || ok {
		t.Errorf("DeleteRecord of a missing record = %v, %v; want false", ok, err)
	}

	if s.cfg.Corrupt != nil {
		bad := key(t)
		s.cfg.Corrupt(t, bad)
		info, err := in.InspectRecord(ctx, bad)
		if err != nil || !info.Found || info.Corrupt == "" {
			t.Errorf("InspectRecord of a corrupt record = %+v, %v; want Found with Corrupt set", info, err)
		}
		if ok, err := in.DeleteRecord(ctx, bad); err != nil || !ok {
			t.Errorf("DeleteRecord of a corrupt record = %v, %v", ok, err)
		}
		if c, err := st.Begin(ctx, idemdriver.MustKey(bad), "fp", time.Second); err != nil || c.State != idemdriver.Acquired {
			t.Errorf("Begin after deleting the corrupt record: %v %v", c.State, err)
		}
	}
}

// listKeys checks idemdriver.Lister, which every oncekit driver implements: an
// in-flight and a completed record are listed, under keys with braces,
// '%', '/' and a placed one among them, and fn returning false stops it.
func (s *suite) listKeys(t *testing.T) {
	st := s.cfg.NewStore(t)
	l, ok := st.(idemdriver.Lister)
	if !ok {
		t.Fatalf("%T does not implement idemdriver.Lister", st)
	}
	ctx := ctxT(t, 20*time.Second)
	base := key(t)
	placed, _ := idem.Placed("sku-1", base+"-placed")
	inFlight, completed := base+"-in-flight", base+"-{x}%2F/done"
	want := map[string]bool{inFlight: true, completed: true, placed: true}
	c, err := st.Begin(ctx, idemdriver.MustKey(inFlight), "fp", 10*time.Second)
	if err != nil || c.State != idemdriver.Acquired {
		t.Fatalf("Begin: %v %v", c.State, err)
	}
	for _, k := range []string{completed, placed} {
		if _, _, err := guard(t, st).Do(ctx, k, "fp", func(context.Context) ([]byte, error) { return []byte("ok"), nil }); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[string]bool{}
	if err := l.ListKeys(ctx, func(k string) bool {
		if want[k] {
			seen[k] = true
		}
		return true
	}); err != nil {
		t.Fatal(err)
	}
	for k := range want {
		if !seen[k] {
			t.Errorf("ListKeys did not list %q", k)
		}
	}
	calls := 0
	if err := l.ListKeys(ctx, func(string) bool { calls++; return false }); err != nil || calls != 1 {
		t.Errorf("ListKeys with fn returning false: %d calls, %v; want 1", calls, err)
	}
}

// longRun: a run that lasts several leases keeps its claim, because the
// Guard's watchdog extends it; duplicates meanwhile find it in flight.
func (s *suite) longRun(t *testing.T) {
	st := s.cfg.NewStore(t)
	k := key(t)
	// A TTL of a second: an extension is three round trips on some
	// drivers (etcd), each a disk sync, and a loaded machine must not
	// make it late (the claim would then rightly be lost).
	g := guard(t, st, idem.WithTTL(time.Second))
	done, started := make(chan error, 1), make(chan struct{})
	go func() {
		_, _, err := g.Do(ctxT(t, 15*time.Second), k, "fp", func(ctx context.Context) ([]byte, error) {
			close(started)
			select {
			case <-time.After(3 * time.Second): // three TTLs
				return []byte("long"), nil
			case <-ctx.Done():
				return nil, context.Cause(ctx)
			}
		})
		done <- err
	}()
	awaitRun(t, started, done)
	other := s.cfg.NewStore(t)
	deadline := time.Now().Add(2800 * time.Millisecond)
	for time.Now().Before(deadline) {
		c, err := other.Begin(ctxT(t, 5*time.Second), idemdriver.MustKey(k), "fp", time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if c.State == idemdriver.Acquired {
			t.Fatal("a duplicate acquired the key while the long run held it")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := <-done; err != nil {
		t.Fatalf("long run: %v", err)
	}
	res, replayed, err := guard(t, other).Do(ctxT(t, 5*time.Second), k, "fp", nil)
	if err != nil || !replayed || string(res) != "long" {
		t.Errorf("after the long run: %q %v %v", res, replayed, err)
	}
}

// closed: after Close, a Store refuses Begin with an error matching
// lock.ErrClosed; a second Close is not an error.
func (s *suite) closed(t *testing.T) {
	st := s.cfg.NewStore(t)
	c, ok := st.(io.Closer)
	if !ok {
		t.Fatalf("%T has no Close method: every driver closes alike", st)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := st.Begin(ctx, idemdriver.MustKey("idemtest-closed"), "fp", time.Minute); !errors.Is(err, lock.ErrClosed) {
		t.Errorf("Begin after Close: %v, want lock.ErrClosed", err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("a second Close: %v, want nil", err)
	}
}
