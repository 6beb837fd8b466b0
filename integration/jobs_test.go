package integration_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/job"
	"github.com/oncekit/oncekit/job/gocronjob"
	"github.com/oncekit/oncekit/lead"
)

// The job and leader worker processes, run by the test binary when
// roleEnv is set: a scheduled job ("job") or a leader's loop ("lead") on
// the store of storeEnv, reporting to the ledger at ledgerEnv, with its
// clock skewed by skewEnv.
const (
	roleEnv   = "ONCEKIT_ROLE_WORKER"
	nameEnv   = "ONCEKIT_ROLE_NAME"
	storeEnv  = "ONCEKIT_ROLE_STORE"
	ledgerEnv = "ONCEKIT_ROLE_LEDGER"
	skewEnv   = "ONCEKIT_ROLE_SKEW"
	roleKey   = "ONCEKIT_ROLE_KEY"
)

// The period of the job's ticks, the TTL of its claims and locks, and how
// long each run works.
const (
	rolePeriod = 500 * time.Millisecond
	roleTTL    = time.Second
	roleWork   = 200 * time.Millisecond
)

func runRoleWorker() {
	testenv.QuietRedisDialErrors()
	name, ledger, key := os.Getenv(nameEnv), os.Getenv(ledgerEnv), os.Getenv(roleKey)
	skew, _ := time.ParseDuration(os.Getenv(skewEnv))
	st, err := openWorkerStore(os.Getenv(storeEnv), roleTTL)
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(3)
	}
	client := &http.Client{Timeout: 5 * time.Second}
	report := func(event string, fence uint64, at time.Time) {
		resp, err := client.Post(fmt.Sprintf("%s/%s?worker=%s&fence=%d&at=%d", ledger, event, name, fence, at.UnixNano()), "text/plain", nil)
		if err == nil {
			resp.Body.Close()
		}
	}
	fmt.Println("ready")
	ctx := context.Background()
	switch os.Getenv(roleEnv) {
	case "job":
		err = job.Run(ctx, st, key, job.Every(rolePeriod), func(ctx context.Context, t job.Tick) error {
			report("start", t.Fence, t.At)
			time.Sleep(roleWork)
			report("done", t.Fence, t.At)
			return nil
		}, job.WithTTL(roleTTL), job.WithClock(func() time.Time { return time.Now().Add(skew) }))
	case "gocron":
		// A gocron scheduler at the Locker's defaults, with a DurationJob
		// whose ticks follow this worker's own start: the skew is how long
		// after the others it starts.
		time.Sleep(skew)
		var locker gocron.Locker
		if locker, err = gocronjob.NewLocker(st); err != nil {
			break
		}
		var s gocron.Scheduler
		if s, err = gocron.NewScheduler(gocron.WithDistributedLocker(locker)); err != nil {
			break
		}
		if _, err = s.NewJob(gocron.DurationJob(time.Second), gocron.NewTask(func() { report("start", 0, time.Now()) }), gocron.WithName(key)); err != nil {
			break
		}
		s.Start()
		select {}
	case "lead":
		err = lead.Run(ctx, st, key, func(ctx context.Context, l lock.Lease) error {
			report("start", l.Fence(), time.Time{})
			select {
			case <-ctx.Done():
			case <-time.After(3 * roleTTL): // lead for a while, then let another lead
			}
			report("done", l.Fence(), time.Time{})
			return nil
		}, lead.WithTTL(roleTTL), lead.WithRetryDelay(50*time.Millisecond))
	}
	fmt.Fprintln(os.Stderr, "worker:", err)
	os.Exit(3)
}

// roleLedger records the runs the workers report.
type roleLedger struct {
	mu      sync.Mutex
	open    map[string]uint64 // worker -> fence of its run that started and has not ended
	killed  map[string]bool
	starts  map[int64][]string  // job: tick -> the workers that started it
	first   map[int64]time.Time // job: tick -> when it was first started
	dones   map[int64][]string  // job: tick -> the workers that finished it
	fences  []uint64            // in start order
	overlap []string
}

func (l *roleLedger) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	q := req.URL.Query()
	worker := q.Get("worker")
	fence, _ := strconv.ParseUint(q.Get("fence"), 10, 64)
	at, _ := strconv.ParseInt(q.Get("at"), 10, 64)
	l.mu.Lock()
	defer l.mu.Unlock()
	switch req.URL.Path {
	case "/start":
		for other, f := range l.open {
			if !l.killed[other] {
				l.overlap = append(l.overlap, fmt.Sprintf("%s (fence %d) started while %s (fence %d) ran", worker, fence, other, f))
			}
		}
		l.open[worker] = fence
		l.fences = append(l.fences, fence)
		if len(l.starts[at]) == 0 {
			l.first[at] = time.Now()
		}
		l.starts[at] = append(l.starts[at], worker)
	case "/done":
		delete(l.open, worker)
		if l.killed[worker] {
			// Its report raced the kill: the run had ended, its claim was
			// not yet completed, and the tick is taken over and run again
			// — the crash between a run and its record, which runs work at
			// least once. Not the mid-run kill this test makes.
			return
		}
		l.dones[at] = append(l.dones[at], worker)
	}
}

// roleRun is one test's workers and their ledger.
type roleRun struct {
	t       *testing.T
	ledger  *roleLedger
	url     string
	workers map[string]*exec.Cmd
}

func startRoles(t *testing.T, role, store string, skews map[string]time.Duration) *roleRun {
	l := &roleLedger{open: map[string]uint64{}, killed: map[string]bool{}, starts: map[int64][]string{}, dones: map[int64][]string{},
		first: map[int64]time.Time{}}
	if strings.HasPrefix(store, "zk://") {
		store += "?session_timeout=1s" // a dead worker's nodes go with its session, here as soon as a lease's TTL
	}
	srv := httptest.NewServer(l)
	t.Cleanup(srv.Close)
	r := &roleRun{t: t, ledger: l, url: srv.URL, workers: map[string]*exec.Cmd{}}
	key := fmt.Sprintf("it-%s-%d", role, time.Now().UnixNano())
	for name, skew := range skews {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), roleEnv+"="+role, nameEnv+"="+name, storeEnv+"="+store, ledgerEnv+"="+srv.URL,
			skewEnv+"="+skew.String(), roleKey+"="+key)
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if line, _ := bufio.NewReader(out).ReadString('\n'); line != "ready\n" {
			t.Fatalf("worker %s said %q", name, line)
		}
		r.workers[name] = cmd
	}
	t.Cleanup(func() {
		for _, c := range r.workers {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
	})
	return r
}

// killRunning kills (SIGKILL) the worker whose run is open, once one is;
// it returns its name.
func (r *roleRun) killRunning(within time.Duration) string {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		r.ledger.mu.Lock()
		for name := range r.ledger.open {
			_ = r.workers[name].Process.Kill()
			r.ledger.killed[name] = true
			r.ledger.mu.Unlock()
			_ = r.workers[name].Wait()
			return name
		}
		r.ledger.mu.Unlock()
		time.Sleep(5 * time.Millisecond)
	}
	r.t.Fatalf("no run started within %s", within)
	return ""
}

func (r *roleRun) checkFences() {
	r.t.Helper()
	for i := 1; i < len(r.ledger.fences); i++ {
		if r.ledger.fences[i] <= r.ledger.fences[i-1] {
			r.t.Errorf("run %d's fence %d is not above the one before, %d", i, r.ledger.fences[i], r.ledger.fences[i-1])
		}
	}
	for _, o := range r.ledger.overlap {
		r.t.Errorf("overlap: %s", o)
	}
}

// Three worker processes whose clocks disagree by up to 2.5 s run a job
// every 500 ms: each tick runs once, on the process whose clock reaches
// it first, with no two runs at once. The process running a tick is
// killed (SIGKILL) mid-run: another, whose clock reaches the tick later,
// takes it over once the claim's TTL has run out and finishes it, once.
func TestJobOncePerTickAcrossSkewedProcesses(t *testing.T) {
	eachStore(t, func(t *testing.T, url string) {
		r := startRoles(t, "job", url, map[string]time.Duration{"late": -time.Second, "exact": 0, "early": 1500 * time.Millisecond})
		// Past the first ticks, which only the workers whose clocks were
		// behind at start reach: from then on the early worker runs each
		// tick first and the others reach it later, ready to take it over.
		time.Sleep(3500 * time.Millisecond)
		killed := r.killRunning(5 * time.Second)
		killedAt := time.Now()
		// The killed tick is taken over when a live worker's clock reaches
		// it (up to 2.5 s later) or its claim runs out: well within 4 s.
		time.Sleep(4 * time.Second)
		r.ledger.mu.Lock()
		defer r.ledger.mu.Unlock()
		r.checkFences()
		cutoff := time.Now().Add(-3 * time.Second) // later ticks may still run
		var killedTick int64 = -1
		for tick, by := range r.ledger.starts {
			if r.ledger.first[tick].After(cutoff) {
				continue
			}
			for _, w := range by {
				if w == killed && len(by) > 1 {
					killedTick = tick
				}
			}
			if n := len(r.ledger.dones[tick]); n != 1 {
				t.Errorf("tick %s finished %d times (started by %v)", time.Unix(0, tick).Format("15:04:05.000"), n, by)
			}
		}
		if killedTick < 0 {
			t.Errorf("the tick %s was running when it was killed was not taken over by another worker (starts %v)", killed, r.ledger.starts)
		}
		if len(r.ledger.dones) < 6 {
			t.Errorf("%d ticks finished in about 5 s of 500 ms ticks", len(r.ledger.dones))
		}
		t.Logf("killed %s mid-run at %s; %d ticks finished", killed, killedAt.Format("15:04:05.000"), len(r.ledger.dones))
	})
}

// Three worker processes lead in turn, one at a time, each term's fence
// above the last; the leader is killed (SIGKILL) and another leads within
// the TTL.
func TestLeaderKilledHandsOverWithinTTL(t *testing.T) {
	eachStore(t, func(t *testing.T, url string) {
		r := startRoles(t, "lead", url, map[string]time.Duration{"a": 0, "b": 0, "c": 0})
		killed := r.killRunning(10 * time.Second)
		killedAt := time.Now()
		var next time.Duration
		for deadline := time.Now().Add(5 * roleTTL); next == 0 && time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			r.ledger.mu.Lock()
			for w := range r.ledger.open {
				if !r.ledger.killed[w] {
					next = time.Since(killedAt)
				}
			}
			r.ledger.mu.Unlock()
		}
		r.ledger.mu.Lock()
		defer r.ledger.mu.Unlock()
		r.checkFences()
		if next == 0 || next > roleTTL+time.Second {
			t.Errorf("after the leader %s was killed, the next led after %s (TTL %s)", killed, next, roleTTL)
		}
	})
}

// Three worker processes run one gocron scheduler each, with gocronjob's
// Locker at its defaults and a one-second DurationJob, started 0, 300 and
// 700 ms apart (so their ticks are spread over the second): the job runs
// once per second across them — never two runs within three quarters of
// a second, never a gap over a second and a quarter.
func TestGocronOncePerPeriodAcrossStaggeredProcesses(t *testing.T) {
	r := startRoles(t, "gocron", "redis://"+testenv.RedisAddrs(t, 1)[0], map[string]time.Duration{"a": 0, "b": 300 * time.Millisecond, "c": 700 * time.Millisecond})
	begin := time.Now()
	time.Sleep(9 * time.Second)
	r.ledger.mu.Lock()
	defer r.ledger.mu.Unlock()
	var runs []int64
	for at := range r.ledger.starts {
		if time.Unix(0, at).After(begin.Add(3 * time.Second)) { // past the first ticks: each worker knows the period
			runs = append(runs, at)
		}
	}
	slices.Sort(runs)
	if len(runs) < 4 {
		t.Fatalf("%d runs in 6 s of a one-second job", len(runs))
	}
	for i := 1; i < len(runs); i++ {
		gap := time.Duration(runs[i] - runs[i-1])
		switch {
		case gap < 750*time.Millisecond:
			t.Errorf("two runs %s apart (by %v and %v): a tick ran twice", gap.Round(time.Millisecond), r.ledger.starts[runs[i-1]], r.ledger.starts[runs[i]])
		case gap > 1250*time.Millisecond:
			t.Errorf("runs %s apart: a tick ran nowhere", gap.Round(time.Millisecond))
		}
	}
	t.Logf("%d runs in 6 s", len(runs))
}
