package idem_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/idem/idemtest"
	"github.com/oncekit/oncekit/core/lock/lockdriver"
	"github.com/oncekit/oncekit/storage/memstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestScopedKey(t *testing.T) {
	a, b := idemdriver.ScopedKey("ab", "c"), idemdriver.ScopedKey("a", "bc")
	if a == b {
		t.Error("scope and key boundaries are not part of the hash")
	}
	if idemdriver.ScopedKey("tenant-1", "k") == idemdriver.ScopedKey("tenant-2", "k") {
		t.Error("two scopes share a stored key")
	}
	if len(a) != 69 || idemdriver.ScopedKey("ab", "c") != a {
		t.Errorf("ScopedKey = %q (%d bytes), want a stable 69-byte key", a, len(a))
	}
}

func TestPlaced(t *testing.T) {
	k, err := idem.Placed("sku-1", "idem:ab")
	if err != nil || k != "{sku-1}idem:ab" {
		t.Fatalf("Placed = %q, %v", k, err)
	}
	if p, ok := idemdriver.PlaceOf(k); !ok || p != "sku-1" {
		t.Errorf("PlaceOf(%q) = %q, %v", k, p, ok)
	}
	if k, err := idem.Placed("", "idem:ab"); err != nil || k != "idem:ab" {
		t.Errorf("an empty place: %q, %v; want the key unplaced", k, err)
	}
	for _, bad := range []string{"a}b", "{a", strings.Repeat("x", idemdriver.MaxPlaceLen+1)} {
		if k, err := idem.Placed(bad, "k"); err == nil {
			t.Errorf("Placed(%q) = %q, want an error", bad, k)
		}
	}
	for _, k := range []string{"idem:ab", "{}x", "x{a}y", "{a", "{" + strings.Repeat("x", idemdriver.MaxPlaceLen+1) + "}k"} {
		if p, ok := idemdriver.PlaceOf(k); ok {
			t.Errorf("PlaceOf(%q) = %q, want not placed", k, p)
		}
	}
}

func TestFingerprint(t *testing.T) {
	if idem.Fingerprint([]byte("POST"), []byte("/a")) == idem.Fingerprint([]byte("POST/"), []byte("a")) {
		t.Error("part boundaries are not part of the fingerprint")
	}
	a, b := idem.Fingerprint([]byte("x")), idem.Fingerprint([]byte("x"))
	if a != b || len(a) != 64 {
		t.Errorf("fingerprint not stable or not hex SHA-256: %q, %q", a, b)
	}
}

// A stored outcome in an unknown encoding is reported, never replayed as
// empty.
func TestCorruptOutcome(t *testing.T) {
	st := memstore.New()
	ctx := context.Background()
	k := idemdriver.ScopedKey("t", "corrupt-outcome")
	c, err := st.Begin(ctx, idemdriver.MustKey(k), "fp", 10e9)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Complete(ctx, c, []byte{0x7f, 0}, 10e9); err != nil {
		t.Fatal(err)
	}
	g, _ := idem.NewGuard(st)
	_, replayed, err := g.Do(ctx, k, "fp", func(context.Context) ([]byte, error) { return nil, nil })
	if ck, _, ok := idemdriver.CorruptRecordOf(err); !ok || ck != k || replayed {
		t.Errorf("Do over an unknown outcome encoding: replayed=%v err=%v, want a CorruptRecord naming the key", replayed, err)
	}
}

func TestNewGuardValidates(t *testing.T) {
	if _, err := idem.NewGuard(nil); err == nil {
		t.Error("NewGuard(nil): no error")
	}
	if _, err := idem.NewGuard(memstore.New(), idem.WithTTL(0)); err == nil {
		t.Error("NewGuard with a zero lease: no error")
	}
	if _, err := idem.NewGuard(memstore.New(), idem.WithWait(-1)); err == nil {
		t.Error("NewGuard with a negative wait: no error")
	}
}

// The engine in a few lines: the first call runs, the duplicate replays.
func ExampleGuard_Do() {
	g, err := idem.NewGuard(memstore.New())
	if err != nil {
		panic(err)
	}
	key := idemdriver.ScopedKey("customer-42", "order-7f3a") // scope + client's idempotency key
	fp := idem.Fingerprint([]byte("POST /orders"), []byte(`{"sku":"phone-x"}`))
	for range 2 {
		res, replayed, err := g.Do(context.Background(), key, fp, func(ctx context.Context) ([]byte, error) {
			return []byte("order 1001 placed"), nil
		})
		fmt.Println(string(res), replayed, err)
	}
	// Output:
	// order 1001 placed false <nil>
	// order 1001 placed true <nil>
}

// The run sees its claim's fence; a per-call wait overrides the Guard's.
func TestFenceAndWaitFromContext(t *testing.T) {
	store := memstore.New()
	g, err := idem.NewGuard(store)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if _, ok := idem.FenceFrom(ctx); ok {
		t.Error("FenceFrom outside a run reported a fence")
	}
	var fences []uint64
	for _, k := range []string{"a", "b"} {
		if _, _, err := g.Do(ctx, k, "fp", func(ctx context.Context) ([]byte, error) {
			f, ok := idem.FenceFrom(ctx)
			if !ok {
				t.Error("no fence in the run's context")
			}
			fences = append(fences, f)
			return nil, nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	if len(fences) != 2 || fences[0] == 0 || fences[1] <= fences[0] {
		t.Errorf("fences %v: want increasing, non-zero", fences)
	}

	started, finish := make(chan struct{}), make(chan struct{})
	go func() {
		_, _, _ = g.Do(ctx, "slow", "fp", func(context.Context) ([]byte, error) {
			close(started)
			<-finish
			return []byte("done"), nil
		})
	}()
	<-started
	if _, _, err := g.Do(ctx, "slow", "fp", nil); !errors.Is(err, idem.ErrInFlight) {
		t.Fatalf("without waiting: %v, want ErrInFlight", err)
	}
	go func() { time.Sleep(20 * time.Millisecond); close(finish) }()
	res, replayed, err := g.Do(idemdriver.ContextWithWait(ctx, 5*time.Second), "slow", "fp", nil)
	if err != nil || !replayed || string(res) != "done" {
		t.Errorf("waiting per call: %q %v %v", res, replayed, err)
	}
}

// flakyComplete fails its first n Completes the way an unreachable store
// does.
type flakyComplete struct {
	idemdriver.Store
	fails atomic.Int32
}

func (f *flakyComplete) Complete(ctx context.Context, c idemdriver.Claim, result []byte, retention time.Duration) error {
	if f.fails.Add(-1) >= 0 {
		return errors.New("dial tcp 127.0.0.1:6379: connect: connection refused")
	}
	return f.Store.Complete(ctx, c, result, retention)
}

// A Complete that fails transiently after the run is retried while the
// claim is alive, so the key does not stay in flight and run again.
func TestCompleteRetriedWhileClaimAlive(t *testing.T) {
	store := &flakyComplete{Store: memstore.New()}
	store.fails.Store(3)
	g, err := idem.NewGuard(store, idem.WithTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	runs := 0
	run := func(context.Context) ([]byte, error) { runs++; return []byte("sold"), nil }
	if res, _, err := g.Do(t.Context(), "order-1", "fp", run); err != nil || string(res) != "sold" {
		t.Fatalf("Do with three failed Completes: %q %v; want the result stored on a retry", res, err)
	}
	res, replayed, err := g.Do(t.Context(), "order-1", "fp", run)
	if err != nil || !replayed || string(res) != "sold" || runs != 1 {
		t.Fatalf("duplicate: %q replayed=%v %v, %d runs; want a replay of the one run", res, replayed, err, runs)
	}

	// A store that stays down: Do gives up once the claim's lease is over,
	// and says the result was not stored.
	store.fails.Store(1 << 30)
	g, err = idem.NewGuard(store, idem.WithTTL(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := g.Do(t.Context(), "order-2", "fp", run); err == nil || !strings.Contains(err.Error(), "not stored") {
		t.Fatalf("Do with a store down for good: %v; want an error saying the result was not stored", err)
	}
}

// ctxStore's Abandon honours its context, as a network store's requests do.
type ctxStore struct{ idemdriver.Store }

func (s ctxStore) Abandon(ctx context.Context, c idemdriver.Claim) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.Store.Abandon(ctx, c)
}

// A run that fails after longer than lockdriver.ReleaseTimeout still gives
// its key back at once: the clean-up context is made when the run is over,
// not before it (one made before would have ended already, and the key
// would stay in flight until its lease ran out).
func TestLongFailedRunGivesKeyBack(t *testing.T) {
	t.Parallel()
	st := ctxStore{memstore.New()}
	g, err := idem.NewGuard(st, idem.WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	failed := errors.New("payment declined")
	_, _, err = g.Do(t.Context(), "long", "fp", func(ctx context.Context) ([]byte, error) {
		time.Sleep(lockdriver.ReleaseTimeout + 100*time.Millisecond) // the watchdog keeps the claim
		return nil, failed
	})
	if !errors.Is(err, failed) {
		t.Fatalf("Do: %v, want the run's error", err)
	}
	if c, err := st.Begin(t.Context(), idemdriver.MustKey("long"), "fp", time.Minute); err != nil || c.State != idemdriver.Acquired {
		t.Fatalf("after the failed run: state %v (%v), want the key free to claim", c.State, err)
	}
}

// One Guard keeps many overlapping runs alive at once, each for several
// leases, on its one timer: every run keeps its claim (a duplicate during
// the run finds it in flight) and every result is stored.
func TestManyLongRunsKeptAlive(t *testing.T) {
	st := memstore.New()
	const lease = 90 * time.Millisecond
	g, err := idem.NewGuard(st, idem.WithTTL(lease))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const runs = 24
	errs := make(chan error, runs)
	for i := range runs {
		go func() {
			time.Sleep(time.Duration(i) * lease / 7) // staggered: extensions fall due at different times
			key := fmt.Sprintf("long-%d", i)
			_, _, err := g.Do(ctx, key, "fp", func(ctx context.Context) ([]byte, error) {
				for range 4 { // four leases long
					select {
					case <-ctx.Done():
						return nil, context.Cause(ctx)
					case <-time.After(lease):
					}
					if c, err := st.Begin(ctx, idemdriver.MustKey(key), "fp", lease); err != nil || c.State != idemdriver.InFlight {
						return nil, fmt.Errorf("mid-run, a duplicate found state %v (%v), want in flight", c.State, err)
					}
				}
				return []byte(key), nil
			})
			errs <- err
		}()
	}
	for range runs {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	for i := range runs {
		key := fmt.Sprintf("long-%d", i)
		if res, replayed, err := g.Do(ctx, key, "fp", nil); err != nil || !replayed || string(res) != key {
			t.Errorf("%s after its run: %q replayed=%v err=%v, want its result replayed", key, res, replayed, err)
		}
	}
}

// NewKey mints UUIDs of version 7 (AIP-155's request_id form): the time in
// their first 48 bits, version and variant set, and no two alike.
func TestNewKeyIsUUIDv7(t *testing.T) {
	form := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	seen := map[string]bool{}
	before := time.Now().UnixMilli()
	for range 1000 {
		k := idemdriver.NewKey()
		if !form.MatchString(k) {
			t.Fatalf("NewKey() = %q, not a version 7 UUID", k)
		}
		if err := idemdriver.CheckClientKey(k); err != nil {
			t.Fatalf("NewKey() = %q: %v", k, err)
		}
		if seen[k] {
			t.Fatalf("NewKey() repeated %q", k)
		}
		seen[k] = true
		ms, err := strconv.ParseInt(strings.ReplaceAll(k[:13], "-", ""), 16, 64)
		if err != nil || ms < before || ms > time.Now().UnixMilli() {
			t.Fatalf("NewKey() = %q: time %d, want within [%d, now]", k, ms, before)
		}
	}
}

// Under ClaimOutlivesCaller, a caller that leaves while its claim is on
// the way to the store does not cut the request short (the store gets a
// context that keeps the caller's values and a deadline, not its
// cancellation); the claim it took is given back before Do returns the
// caller's error, so the key is free at once. Without the mark the store
// gets the caller's own context.
func TestClaimOutlivesCaller(t *testing.T) {
	type valueKey struct{}
	for _, marked := range []bool{true, false} {
		mem, began, release := memstore.New(), make(chan context.Context, 1), make(chan struct{})
		st := idemtest.BeforeBegin(mem, func(ctx context.Context) {
			began <- ctx
			<-release // held back until the caller has left
		})
		g, err := idem.NewGuard(st)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.WithValue(t.Context(), valueKey{}, "v"))
		callCtx := ctx
		if marked {
			callCtx = idemdriver.ClaimOutlivesCaller(ctx)
		}
		done := make(chan error, 1)
		go func() {
			_, _, err := g.Do(callCtx, "k", "fp", func(context.Context) ([]byte, error) {
				t.Error("ran for a caller that had left")
				return nil, nil
			})
			done <- err
		}()
		sctx := <-began
		cancel()
		if got := sctx.Value(valueKey{}); got != "v" {
			t.Errorf("marked=%v: the store's context lost the caller's values (%v)", marked, got)
		}
		if _, ok := sctx.Deadline(); marked && (sctx.Err() != nil || !ok) {
			t.Errorf("marked: the store's context ended with the caller's (%v) or has no deadline", sctx.Err())
		}
		if !marked && sctx.Err() == nil {
			t.Error("unmarked: the store's context did not end with the caller's")
		}
		close(release)
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("marked=%v: Do = %v, want the caller's context.Canceled", marked, err)
		}
		if marked {
			// Given back: the next caller claims the key at once.
			c, err := mem.Begin(t.Context(), idemdriver.MustKey("k"), "fp", time.Second)
			if err != nil || c.State != idemdriver.Acquired {
				t.Errorf("after the caller left: Begin = %v, %v; want the key free", c.State, err)
			}
		}
	}
}
