package sqlstore_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/internal/testenv"
)

// batchDatabases are the PostgreSQL set-ups whose Stores batch: the
// server itself and pgbouncer in transaction pooling mode.
func batchDatabases(t *testing.T) map[string]string {
	dbs := map[string]string{"postgres": testenv.PostgresURL(t)}
	if os.Getenv("PGBOUNCER_URL") != "" || testenv.Required() {
		dbs["postgres-pgbouncer"] = withParam(testenv.PgBouncerURL(t), "notify=false&default_query_exec_mode=exec")
	}
	return dbs
}

// waitQueued waits until n calls queue behind HoldBatches.
func waitQueued(t *testing.T, queued func() int, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); queued() < n; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d calls queued, want %d", queued(), n)
		}
	}
}

// Claims and completions that arrive while others are in flight go out
// together, and each keeps its own answer: new keys claimed with their
// own tokens and fences, one winner among duplicates of a key, replays
// answered, a stale completion refused.
func TestConcurrentCallsShareStatements(t *testing.T) {
	for name, url := range batchDatabases(t) {
		t.Run(name, func(t *testing.T) { concurrentCallsShareStatements(t, url) })
	}
}

func concurrentCallsShareStatements(t *testing.T, url string) {
	s := migrated(t, url)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	base := "batch:" + time.Now().Format(time.RFC3339Nano) + ":"
	done, err := s.Begin(ctx, idemdriver.MustKey(base+"done"), "fp", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, done, []byte("stored"), time.Hour); err != nil {
		t.Fatal(err)
	}

	const fresh, dups, replays = 30, 5, 5
	keys := make([]string, 0, fresh+dups+replays)
	for i := range fresh {
		keys = append(keys, fmt.Sprintf("%snew-%d", base, i))
	}
	for range dups {
		keys = append(keys, base+"dup")
	}
	for range replays {
		keys = append(keys, base+"done")
	}
	claims := make([]idemdriver.Claim, len(keys))
	errs := make([]error, len(keys))
	queued, release := s.HoldBatches()
	var wg sync.WaitGroup
	for i, k := range keys {
		wg.Go(func() { claims[i], errs[i] = s.Begin(ctx, idemdriver.MustKey(k), "fp", time.Minute) })
	}
	// (Of the copies of one key, the first is sent; the others wait for
	// its answer in the Store: local.go.)
	waitQueued(t, queued, fresh+2)
	release()
	wg.Wait()

	tokens := map[string]bool{}
	var acquired []idemdriver.Claim
	dupWinners := 0
	for i, c := range claims {
		if errs[i] != nil {
			t.Fatalf("Begin %s: %v", keys[i], errs[i])
		}
		switch {
		case i < fresh:
			if c.State != idemdriver.Acquired || c.Token == "" || tokens[c.Token] || c.Fence == 0 || c.Attempt != 1 {
				t.Fatalf("new key %s: %+v, want acquired with a token of its own, a fence, attempt 1", keys[i], c)
			}
		case i < fresh+dups:
			if c.State == idemdriver.Acquired {
				dupWinners++
			} else if c.State != idemdriver.InFlight {
				t.Fatalf("duplicate %s: %v, want acquired or in flight", keys[i], c.State)
			}
		default:
			if c.State != idemdriver.Completed || string(c.Result) != "stored" {
				t.Fatalf("replay %s: %v %q, want the stored result", keys[i], c.State, c.Result)
			}
		}
		if c.State == idemdriver.Acquired {
			tokens[c.Token] = true
			acquired = append(acquired, c)
		}
	}
	if dupWinners != 1 {
		t.Fatalf("%d of %d duplicates claimed the key, want 1", dupWinners, dups)
	}

	// Complete every claim at once, and one with a token that is not the
	// record's.
	stale := acquired[0]
	stale.Token = "not-the-claims"
	finishing := append(acquired, stale)
	cerrs := make([]error, len(finishing))
	queued, release = s.HoldBatches()
	for i, c := range finishing {
		wg.Go(func() { cerrs[i] = s.Complete(ctx, c, []byte("r:"+c.Key.String()), time.Hour) })
	}
	waitQueued(t, queued, len(finishing))
	release()
	wg.Wait()
	for i, err := range cerrs[:len(acquired)] {
		if err != nil {
			t.Fatalf("Complete %s: %v", finishing[i].Key, err)
		}
	}
	if err := cerrs[len(acquired)]; !errors.Is(err, lock.ErrLockLost) {
		t.Fatalf("Complete with a stale token: %v, want ErrLockLost", err)
	}
	for _, c := range acquired {
		got, err := s.Begin(ctx, c.Key, "fp", time.Minute)
		if err != nil || got.State != idemdriver.Completed || string(got.Result) != "r:"+c.Key.String() {
			t.Fatalf("after the completions, %s: %v %q %v", c.Key, got.State, got.Result, err)
		}
	}
	if s.Batched() == 0 {
		t.Fatal("no statement carried more than one call")
	}
}

// A batch of claims does not wait for a row another transaction is
// writing (a duplicate of a claim whose effect transaction runs): the new
// keys of the batch are claimed, the duplicate answered, while that
// transaction stays open.
func TestBatchedClaimsPassARowBeingWritten(t *testing.T) {
	for name, url := range batchDatabases(t) {
		t.Run(name, func(t *testing.T) { batchedClaimsPassARowBeingWritten(t, url) })
	}
}

func batchedClaimsPassARowBeingWritten(t *testing.T, url string) {
	s := migrated(t, url)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	base := "batch-busy:" + time.Now().Format(time.RFC3339Nano) + ":"
	// (Claimed by another process: a duplicate of a claim s holds itself
	// is answered in s, with no statement.)
	busy, err := migrated(t, url).Begin(ctx, idemdriver.MustKey(base+"busy"), "fp", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	lockRecordRow(ctx, t, s, "UPDATE %s SET watched = true WHERE record_key = ?", busy.Key.String())

	keys := []string{base + "busy", base + "a", base + "b", base + "c"}
	claims := make([]idemdriver.Claim, len(keys))
	errs := make([]error, len(keys))
	bctx, bcancel := context.WithTimeout(ctx, 5*time.Second)
	defer bcancel()
	queued, release := s.HoldBatches()
	var wg sync.WaitGroup
	for i, k := range keys {
		wg.Go(func() { claims[i], errs[i] = s.Begin(bctx, idemdriver.MustKey(k), "fp", time.Minute) })
	}
	waitQueued(t, queued, len(keys))
	release()
	wg.Wait()
	for i, c := range claims {
		want := idemdriver.Acquired
		if i == 0 {
			want = idemdriver.InFlight
		}
		if errs[i] != nil || c.State != want {
			t.Errorf("Begin %s while another transaction writes %s's row: %v %v, want %v", keys[i], keys[0], c.State, errs[i], want)
		}
	}
}

// A caller that stops waiting while its claim is queued leaves nothing
// behind: the call is not sent, and the key is free for the next Begin.
func TestQueuedClaimWhoseCallerLeft(t *testing.T) {
	s := migrated(t, testenv.PostgresURL(t))
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	key := idemdriver.MustKey("batch-left:" + time.Now().Format(time.RFC3339Nano))
	queued, release := s.HoldBatches()
	lctx, lcancel := context.WithCancel(ctx)
	left := make(chan error, 1)
	go func() {
		_, err := s.Begin(lctx, key, "fp", time.Minute)
		left <- err
	}()
	waitQueued(t, queued, 1)
	lcancel()
	if err := <-left; !errors.Is(err, context.Canceled) {
		t.Fatalf("Begin whose caller left: %v, want context.Canceled", err)
	}
	release()
	c, err := s.Begin(ctx, key, "fp", time.Minute)
	if err != nil || c.State != idemdriver.Acquired || c.Attempt != 1 {
		t.Fatalf("the next Begin: %+v %v, want acquired, attempt 1", c, err)
	}
}

// A completion batched with others notifies a duplicate that waits for it
// in another process.
func TestBatchedCompletionWakesADuplicate(t *testing.T) {
	s := migrated(t, testenv.PostgresURL(t))
	dup := open(t, testenv.PostgresURL(t))
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	base := "batch-woken:" + time.Now().Format(time.RFC3339Nano) + ":"
	var claims []idemdriver.Claim
	for _, k := range []string{"watched", "b", "c"} {
		c, err := s.Begin(ctx, idemdriver.MustKey(base+k), "fp", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		claims = append(claims, c)
	}
	woken := duplicateWaits(ctx, dup, claims[0].Key)
	time.Sleep(300 * time.Millisecond) // (it marks the record watched and listens)
	queued, release := s.HoldBatches()
	var wg sync.WaitGroup
	for _, c := range claims {
		wg.Go(func() {
			if err := s.Complete(ctx, c, []byte("r"), time.Minute); err != nil {
				t.Error(err)
			}
		})
	}
	waitQueued(t, queued, len(claims))
	completed := time.Now()
	release()
	wg.Wait()
	if late := (<-woken).Sub(completed); late > 500*time.Millisecond {
		t.Errorf("the duplicate returned %v after the batched completion, want at once (notified)", late.Round(time.Millisecond))
	}
}

// Completions whose results would make a statement larger than a MiB do
// not share one: each goes with what fits, here alone.
func TestLargeResultsGoAlone(t *testing.T) {
	s := migrated(t, testenv.PostgresURL(t))
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	base := "batch-large:" + time.Now().Format(time.RFC3339Nano) + ":"
	var claims []idemdriver.Claim
	for i := range 3 {
		c, err := s.Begin(ctx, idemdriver.MustKey(fmt.Sprint(base, i)), "fp", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		claims = append(claims, c)
	}
	result := []byte(strings.Repeat("r", 600<<10))
	before := s.Batched()
	queued, release := s.HoldBatches()
	var wg sync.WaitGroup
	for _, c := range claims {
		wg.Go(func() {
			if err := s.Complete(ctx, c, result, time.Minute); err != nil {
				t.Error(err)
			}
		})
	}
	waitQueued(t, queued, len(claims))
	release()
	wg.Wait()
	if n := s.Batched() - before; n != 0 {
		t.Errorf("%d statements carried more than one 600 KiB result, want none", n)
	}
	for _, c := range claims {
		got, err := s.Begin(ctx, c.Key, "fp", time.Minute)
		if err != nil || got.State != idemdriver.Completed || len(got.Result) != len(result) {
			t.Fatalf("%s: %v, %d bytes, %v", c.Key, got.State, len(got.Result), err)
		}
	}
}

// Claims whose shared statement ran but whose answer was lost (their
// callers' ctxs ended while it ran) are given back, each by its caller:
// the keys are claimed again at once, not once the leases run out.
func TestLostBatchAnswerGivesTheClaimsBack(t *testing.T) {
	dbURL := testenv.PostgresURL(t)
	migrated(t, dbURL)
	u, _ := url.Parse(dbURL)
	proxy := testenv.StartProxy(t, u.Host)
	s, other := open(t, withHost(t, dbURL, proxy.Addr)), open(t, dbURL)
	ctx := t.Context()
	base := "lost-batch:" + time.Now().Format(time.RFC3339Nano) + ":"
	warm, err := s.Begin(ctx, idemdriver.MustKey(base+"warm"), "fp", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, warm, []byte("r"), time.Minute); err != nil {
		t.Fatal(err)
	}
	keys := []string{base + "a", base + "b", base + "c"}
	proxy.StallAfter(testenv.Contains([]byte(keys[0])))
	bctx, cancel := context.WithCancel(ctx)
	errs := make(chan error, len(keys))
	queued, release := s.HoldBatches()
	for _, k := range keys {
		go func() {
			_, err := s.Begin(bctx, idemdriver.MustKey(k), "fp", 30*time.Second)
			errs <- err
		}()
	}
	waitQueued(t, queued, len(keys))
	release()
	proxy.WaitStalled(t, 10*time.Second)
	time.Sleep(100 * time.Millisecond) // (the server runs the statement it got)
	for _, k := range keys {
		if c, err := other.Begin(ctx, idemdriver.MustKey(k), "fp", time.Minute); err != nil || c.State != idemdriver.InFlight {
			t.Fatalf("%s while the batch's answer is held: %v %v, want in flight (the statement ran)", k, c.State, err)
		}
	}
	cancel()
	for range keys {
		if err := <-errs; err == nil {
			t.Fatal("a Begin whose ctx ended before its batch's answer came returned no error")
		}
	}
	proxy.Resume()
	deadline := time.Now().Add(10 * time.Second)
	for _, k := range keys {
		for {
			c, err := other.Begin(ctx, idemdriver.MustKey(k), "fp", time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if c.State == idemdriver.Acquired {
				if c.Attempt != 2 {
					t.Errorf("%s: the retry's attempt %d, want 2 (the lost claim counted)", k, c.Attempt)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("10 s after the lost answer %s is still %v (its lease is 30 s): not given back", k, c.State)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if s.Batched() == 0 {
		t.Fatal("the claims did not share a statement")
	}
}
