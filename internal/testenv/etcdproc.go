package testenv

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// EtcdAddrs returns the client endpoints of the test etcd server from
// ETCD_ENDPOINTS, or skips (fails under ONCEKIT_REQUIRE_SERVERS=1).
func EtcdAddrs(tb testing.TB) []string {
	tb.Helper()
	return addrs(tb, "ETCD_ENDPOINTS", 1)
}

// EtcdMember is one etcd process a test starts for itself, to kill and
// restart it.
type EtcdMember struct {
	tb       testing.TB
	Name     string
	Endpoint string // client URL
	args     []string
	dir      string
	cmd      *exec.Cmd
}

// StartEtcdCluster starts n etcd members on free 127.0.0.1 ports as one
// cluster (n = 1 for a single node) and stops them at cleanup. It skips
// (fails under ONCEKIT_REQUIRE_SERVERS=1) when etcd is not installed.
//
// Its members beat every 50 ms and call an election after 500 ms, ten times
// faster than etcd's defaults, so that tests of failovers are quick.
func StartEtcdCluster(tb testing.TB, n int) []*EtcdMember {
	tb.Helper()
	return startEtcdCluster(tb, n, "50", "500")
}

// StartEtcdClusterDefaultTiming is StartEtcdCluster with etcd's own
// heartbeat (100 ms) and election timeout (1 s), as users run it: among
// other things the server then raises every lease to at least 2 s.
func StartEtcdClusterDefaultTiming(tb testing.TB, n int) []*EtcdMember {
	tb.Helper()
	return startEtcdCluster(tb, n, "100", "1000")
}

func startEtcdCluster(tb testing.TB, n int, heartbeatMs, electionMs string) []*EtcdMember {
	tb.Helper()
	skipShort(tb)
	if _, err := exec.LookPath("etcd"); err != nil {
		msg := "etcd not installed (make services-up installs it)"
		if Required() {
			tb.Fatal(msg)
		}
		tb.Skip(msg)
	}
	// Free ports are picked and then bound by etcd: another test process
	// may take one in between. A cluster that does not come up is started
	// again on other ports.
	var errs []string
	for range 3 {
		members, err := startCluster(tb, n, heartbeatMs, electionMs)
		if err == nil {
			return members
		}
		errs = append(errs, err.Error())
	}
	tb.Fatalf("etcd cluster of %d did not start:\n%s", n, strings.Join(errs, "\n"))
	return nil
}

func startCluster(tb testing.TB, n int, heartbeatMs, electionMs string) ([]*EtcdMember, error) {
	type ports struct{ client, peer int }
	ps := make([]ports, n)
	var initial []string
	for i := range ps {
		ps[i] = ports{freePort(tb), freePort(tb)}
		initial = append(initial, fmt.Sprintf("m%d=http://127.0.0.1:%d", i, ps[i].peer))
	}
	token := fmt.Sprintf("oncekit-test-%d", time.Now().UnixNano())
	members := make([]*EtcdMember, n)
	for i, p := range ps {
		m := &EtcdMember{tb: tb, Name: fmt.Sprintf("m%d", i), dir: tb.TempDir()}
		m.Endpoint = fmt.Sprintf("http://127.0.0.1:%d", p.client)
		peer := fmt.Sprintf("http://127.0.0.1:%d", p.peer)
		m.args = []string{
			"--name", m.Name, "--data-dir", filepath.Join(m.dir, "data"),
			"--listen-client-urls", m.Endpoint, "--advertise-client-urls", m.Endpoint,
			"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
			"--initial-cluster", strings.Join(initial, ","),
			"--initial-cluster-token", token, "--initial-cluster-state", "new",
			"--heartbeat-interval", heartbeatMs, "--election-timeout", electionMs,
		}
		members[i] = m
		m.spawn()
		tb.Cleanup(m.Kill)
	}
	for _, m := range members {
		if err := m.healthy(10 * time.Second); err != nil {
			for _, m := range members {
				m.Kill()
			}
			return nil, err
		}
	}
	return members, nil
}

func (m *EtcdMember) spawn() {
	m.tb.Helper()
	log, err := os.OpenFile(filepath.Join(m.dir, "etcd.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		m.tb.Fatal(err)
	}
	m.cmd = exec.Command("etcd", m.args...)
	m.cmd.Stdout, m.cmd.Stderr = log, log
	if err := m.cmd.Start(); err != nil {
		m.tb.Fatalf("start etcd: %v", err)
	}
	log.Close()
}

// waitHealthy waits until the member answers /health with true, or fails
// the test.
func (m *EtcdMember) waitHealthy() {
	m.tb.Helper()
	if err := m.healthy(20 * time.Second); err != nil {
		m.tb.Fatal(err)
	}
}

// healthy waits up to timeout for the member to answer /health with true.
func (m *EtcdMember) healthy(timeout time.Duration) error {
	c := http.Client{Timeout: 500 * time.Millisecond}
	deadline := time.Now().Add(timeout)
	for {
		resp, err := c.Get(m.Endpoint + "/health")
		if err == nil {
			var b [128]byte
			n, _ := resp.Body.Read(b[:])
			resp.Body.Close()
			if strings.Contains(string(b[:n]), `"health":"true"`) {
				return nil
			}
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(m.dir, "etcd.log"))
			if len(log) > 2000 {
				log = log[len(log)-2000:]
			}
			return fmt.Errorf("etcd %s at %s not healthy: %v\n%s", m.Name, m.Endpoint, err, log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Kill stops the member with SIGKILL and waits for it to exit.
func (m *EtcdMember) Kill() {
	if m.cmd == nil || m.cmd.Process == nil {
		return
	}
	_ = m.cmd.Process.Signal(syscall.SIGCONT)
	_ = m.cmd.Process.Kill()
	_ = m.cmd.Wait()
	m.cmd = nil
}

// Pause stops the member with SIGSTOP: its connections stay open and
// nothing sent on them is answered until Resume. Kill and cleanup resume
// it first.
func (m *EtcdMember) Pause() {
	m.tb.Helper()
	if err := m.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		m.tb.Fatalf("pause etcd %s: %v", m.Name, err)
	}
}

// Resume continues a paused member.
func (m *EtcdMember) Resume() {
	m.tb.Helper()
	if err := m.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		m.tb.Fatalf("resume etcd %s: %v", m.Name, err)
	}
}

// Restart starts a killed member again with its data directory: it
// rejoins its cluster. It does not wait for the cluster to be healthy.
func (m *EtcdMember) Restart() {
	m.tb.Helper()
	args := slicesReplace(m.args, "--initial-cluster-state", "existing")
	m.args = args
	m.spawn()
}

// WaitHealthy waits until the member reports itself healthy.
func (m *EtcdMember) WaitHealthy() { m.waitHealthy() }

func slicesReplace(args []string, flag, value string) []string {
	out := append([]string(nil), args...)
	for i := 0; i+1 < len(out); i++ {
		if out[i] == flag {
			out[i+1] = value
		}
	}
	return out
}
