//go:build soak

package integration_test

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/oncekit/oncekit/examples/inventory/flashsale"
	"github.com/oncekit/oncekit/internal/testenv"
)

// TestSoak runs flash sales back to back for ONCEKIT_SOAK (a duration, say
// 10m; `make soak`) against three replica processes on a durable Redis,
// with a fault every 30 s in turn: a replica killed with SIGKILL (and
// started again), the store killed and restarted, a replica paused for
// 5 s. Every sale must keep every invariant. It is not part of `make
// test`: it builds only with the soak tag (`make soak`).
func TestSoak(t *testing.T) {
	d, err := time.ParseDuration(os.Getenv("ONCEKIT_SOAK"))
	if err != nil || d <= 0 {
		t.Fatal("ONCEKIT_SOAK must be a duration, like 10m")
	}
	srv := testenv.StartDurableRedis(t)
	dep := deploy(t, "redis://"+srv.Addr, 3)
	faults := []struct {
		name string
		do   func()
	}{
		{"replica killed", func() {
			i := 1 + len(dep.replicas)%2 // not the first: it answers the report's reads
			dep.replicas[i].kill()
			time.Sleep(2 * time.Second)
			r := dep.start()
			dep.replicas[i], dep.httpTargets[i], dep.grpcTargets[i] = r, "http://"+r.http, r.grpc
		}},
		{"store restarted", func() { srv.Kill(); time.Sleep(time.Second); srv.Start() }},
		{"replica paused 5s", func() {
			p := dep.replicas[2].cmd.Process
			_ = p.Signal(syscall.SIGSTOP)
			time.Sleep(5 * time.Second)
			_ = p.Signal(syscall.SIGCONT)
		}},
	}
	end := time.Now().Add(d)
	nextFault, fi := time.Now().Add(30*time.Second), 0
	var sales, sold, orders, requests, replays, retried int64
	var injected []string
	for time.Now().Before(end) {
		done := make(chan *flashsale.Report, 1)
		targets, grpcs := append([]string(nil), dep.httpTargets...), append([]string(nil), dep.grpcTargets...)
		go func() {
			rep, err := flashsale.Run(t.Context(), flashsale.Config{Targets: targets, GRPC: grpcs, Buyers: 500, Stock: 120, AllowRefused: true,
				DupRate: 0.3, Shipping: time.Minute, Attempts: 60})
			if err != nil {
				t.Error(err)
			}
			done <- rep
		}()
		var rep *flashsale.Report
	wait:
		for {
			select {
			case rep = <-done:
				break wait
			case <-time.After(time.Until(nextFault)):
				f := faults[fi%len(faults)]
				f.do()
				injected = append(injected, f.name)
				fi++
				nextFault = time.Now().Add(30 * time.Second)
			}
		}
		if rep == nil {
			t.Fatal("a sale did not run")
		}
		sales++
		sold += rep.Sold
		orders += rep.Confirmed
		requests += rep.Requests
		replays += rep.Replays
		retried += rep.Retried
		if !rep.OK() {
			var out strings.Builder
			rep.Print(&out)
			t.Fatalf("sale %d broke an invariant:\n%s", sales, out.String())
		}
	}
	t.Logf("soak %v: %d sales, %d requests, %d orders confirmed, %d units sold, %d replays, %d retried answers; "+
		"faults: %d (%s); violations: 0 oversold, 0 duplicate executions, 0 differing replays, 0 missing shipments",
		d, sales, requests, orders, sold, replays, retried, len(injected), strings.Join(uniq(injected), ", "))
	fmt.Fprintf(os.Stderr, "soak passed: %d sales, %d faults\n", sales, len(injected))
}

func uniq(ss []string) []string {
	seen := map[string]int{}
	var out []string
	for _, s := range ss {
		if seen[s] == 0 {
			out = append(out, s)
		}
		seen[s]++
	}
	for i, s := range out {
		out[i] = fmt.Sprintf("%s ×%d", s, seen[s])
	}
	return out
}
