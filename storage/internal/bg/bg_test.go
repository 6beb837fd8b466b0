package bg

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestWaitWaitsForWorkAndWorkers(t *testing.T) {
	var g Group
	var done atomic.Int64
	release := make(chan struct{})
	for range 8 {
		g.Go(func() {
			<-release
			done.Add(1)
		})
	}
	waited := make(chan struct{})
	go func() {
		g.Wait()
		close(waited)
	}()
	select {
	case <-waited:
		t.Fatal("Wait returned while work was running")
	case <-time.After(20 * time.Millisecond):
	}
	close(release)
	<-waited
	if n := done.Load(); n != 8 {
		t.Fatalf("%d of 8 jobs done when Wait returned", n)
	}
	// goleak (TestMain) checks that no worker outlives Wait.
}

func TestWorkersAreReused(t *testing.T) {
	var g Group
	defer g.Wait()
	for range 100 {
		ch := make(chan struct{})
		g.Go(func() { close(ch) })
		<-ch
		// Give the worker the moment it needs to park before the next Go.
		for deadline := time.Now().Add(time.Second); idle(&g) != 1 && time.Now().Before(deadline); {
			time.Sleep(10 * time.Microsecond)
		}
	}
	if n := idle(&g); n != 1 {
		t.Fatalf("%d idle workers after 100 sequential jobs, want 1", n)
	}
}

// idle is how many of g's workers wait for work.
func idle(g *Group) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.idle)
}

func TestConcurrentGoAndWait(t *testing.T) {
	var g Group
	var ran atomic.Int64
	var callers sync.WaitGroup
	for range 16 {
		callers.Go(func() {
			for range 200 {
				g.Go(func() { ran.Add(1) })
			}
		})
	}
	time.Sleep(time.Millisecond)
	g.Wait() // some jobs run inline from here on
	callers.Wait()
	g.Wait()
	if n := ran.Load(); n != 16*200 {
		t.Fatalf("ran %d jobs, want %d", n, 16*200)
	}
}

func TestIdleWorkersRetire(t *testing.T) {
	old := idleFor
	idleFor = 5 * time.Millisecond
	defer func() { idleFor = old }()
	var g Group
	ch := make(chan struct{})
	g.Go(func() { close(ch) })
	<-ch
	exited := make(chan struct{})
	go func() {
		g.workers.Wait() // without Wait: the worker leaves on its own
		close(exited)
	}()
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		t.Fatal("an idle worker did not exit")
	}
	if n := idle(&g); n != 0 {
		t.Fatalf("%d workers still listed idle", n)
	}
}

func TestGoAfterWaitRunsInline(t *testing.T) {
	var g Group
	g.Wait()
	ran := false
	g.Go(func() { ran = true })
	if !ran {
		t.Fatal("Go after Wait did not run its work before returning")
	}
}

// Settle waits for the work in flight and lets work start again after it.
func TestSettle(t *testing.T) {
	var g Group
	defer g.Wait()
	if !g.Settle(time.Millisecond) {
		t.Fatal("an idle group is not settled")
	}
	release := make(chan struct{})
	done := make(chan struct{})
	g.Go(func() { <-release; close(done) })
	if g.Settle(20 * time.Millisecond) {
		t.Fatal("settled with work in flight")
	}
	time.AfterFunc(20*time.Millisecond, func() { close(release) })
	if !g.Settle(5 * time.Second) {
		t.Fatal("not settled after the work ended")
	}
	select {
	case <-done:
	default:
		t.Fatal("settled before the work ended")
	}
	ran := make(chan struct{})
	g.Go(func() { close(ran) })
	<-ran // work still runs in the background after Settle
}
