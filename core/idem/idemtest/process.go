package idemtest

import (
	"context"
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/internal/childproc"
)

// The runner process: KilledRunIsRetried starts the test binary again
// with this variable set; the driver's TestMain calls RunRunner, which
// begins a run under the key and waits, mid-run, to be killed.
const runnerKeyEnv = "ONCEKIT_IDEMTEST_RUNNER_KEY"

// runnerTTL is the runner's Guard's TTL: the watchdog keeps its claim
// alive until the process dies, and the claim ends about a TTL later.
const runnerTTL = 2 * time.Second

// RunRunner is for a driver's TestMain. In the child process that the
// suite's KilledRunIsRetried case starts, it runs a Guard.Do on the key
// the suite names with a Store from newStore, reports "running" on stdout
// from inside the run and waits to be killed; it never returns there. In
// any other process it returns at once.
//
//	func TestMain(m *testing.M) {
//		idemtest.RunRunner(func() (idemdriver.Store, error) { return redisstore.New(client()) })
//		os.Exit(m.Run())
//	}
func RunRunner(newStore func() (idemdriver.Store, error)) {
	key := os.Getenv(runnerKeyEnv)
	if key == "" {
		return
	}
	fmt.Println("error:", runMidway(newStore, key))
	os.Exit(3)
}

func runMidway(newStore func() (idemdriver.Store, error), key string) error {
	st, err := newStore()
	if err != nil {
		return err
	}
	g, err := idem.NewGuard(st, idem.WithTTL(runnerTTL))
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, _, err = g.Do(ctx, key, "fp", func(ctx context.Context) ([]byte, error) {
		if n, _ := idem.AttemptFrom(ctx); n != 1 {
			return nil, fmt.Errorf("the first run's attempt is %d", n)
		}
		fmt.Println("running")
		<-ctx.Done() // killed before this
		return nil, context.Cause(ctx)
	})
	return fmt.Errorf("the run ended: %v", err)
}

// killedRun: a process killed with SIGKILL in the middle of its run leaves
// a claim that ends a TTL later; the next Do of the key (another process:
// this one) waits for it, runs it again and sees attempt 2.
func (s *suite) killedRun(t *testing.T) {
	if !s.cfg.RunnerProcess {
		return // an in-process driver: no other process shares its records
	}
	// The Store first: a driver whose servers are not configured skips
	// here, before a runner process is started that could not reach them.
	st := s.cfg.NewStore(t)
	k := key(t)
	child := childproc.Start(t, append(append([]string{}, s.cfg.ProcessEnv...), runnerKeyEnv+"="+k), "running", 20*time.Second)
	time.Sleep(runnerTTL / 2) // an extension or two
	if err := child.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = child.Wait()
	ctx := ctxT(t, 30*time.Second)
	var attempt int
	res, replayed, err := guard(t, st, idem.WithWait(20*time.Second)).Do(ctx, k, "fp", func(ctx context.Context) ([]byte, error) {
		attempt, _ = idem.AttemptFrom(ctx)
		return []byte("again"), nil
	})
	if err != nil || replayed || string(res) != "again" {
		t.Fatalf("Do after the runner was killed: %q replayed=%v %v; want a fresh run", res, replayed, err)
	}
	if attempt != 2 {
		t.Errorf("the run after the killed one saw attempt %d, want 2", attempt)
	}
}
