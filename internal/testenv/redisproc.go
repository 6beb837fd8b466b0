package testenv

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisProcess is a redis-server a test starts for itself, to stop, pause
// and restart it: faults are injected into real processes.
type RedisProcess struct {
	tb      testing.TB
	Addr    string
	port    int
	dir     string
	durable bool
	cmd     *exec.Cmd
	// args, when set, are the process's own arguments (a replica, a
	// sentinel) instead of a plain server's.
	args []string
}

// StartRedis starts a private redis-server on a free 127.0.0.1 port and
// stops it at cleanup. It skips (fails under ONCEKIT_REQUIRE_SERVERS=1)
// when redis-server is not installed.
func StartRedis(tb testing.TB) *RedisProcess { return startRedis(tb, false) }

// StartDurableRedis is StartRedis with an append-only file synced on every
// write: a restart (Kill, then Start) finds the data it had, as a
// production server configured for durability would.
func StartDurableRedis(tb testing.TB) *RedisProcess { return startRedis(tb, true) }

func startRedis(tb testing.TB, durable bool) *RedisProcess {
	tb.Helper()
	skipShort(tb)
	if _, err := exec.LookPath("redis-server"); err != nil {
		msg := "redis-server not installed (make services-up installs it)"
		if Required() {
			tb.Fatal(msg)
		}
		tb.Skip(msg)
	}
	p := &RedisProcess{tb: tb, port: freePort(tb), dir: tb.TempDir(), durable: durable}
	p.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port))
	p.Start()
	tb.Cleanup(p.Kill)
	return p
}

// handedOut are the ports freePort has returned in this process: tests
// run in parallel, and a port probed free may be probed again before the
// server it was meant for has bound it.
var handedOut sync.Map

// freePort returns a 127.0.0.1 port nothing listens on, and never the
// same one twice in a process. It is taken below the kernel's ephemeral
// range (ip_local_port_range): a port from that range is what the
// kernel gives every outgoing connection, and one of the thousands a
// parallel make test opens could take it between the probe and the
// server's bind — or while a test has the server stopped, before it
// restarts it on the same port.
func freePort(tb testing.TB) int {
	tb.Helper()
	lo, hi := 10000, ephemeralLow()-1
	for range 10000 {
		port := lo + rand.IntN(hi-lo+1)
		if _, dup := handedOut.LoadOrStore(port, true); dup {
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue // in use (another process's server)
		}
		l.Close()
		return port
	}
	tb.Fatal("testenv: no free port below the ephemeral range")
	return 0
}

// ephemeralLow is the first port of the kernel's ephemeral range
// (32768 when it cannot be read), at least 20000.
func ephemeralLow() int {
	low := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				low = n
			}
		}
	}
	return max(low, 20000)
}

// Start (re)starts the server on its port — empty, unless it is durable —
// and waits until it accepts connections.
func (p *RedisProcess) Start() {
	p.tb.Helper()
	aof := []string{"--appendonly", "no"}
	if p.durable {
		aof = []string{"--appendonly", "yes", "--appendfsync", "always"}
	}
	args := append([]string{"--port", strconv.Itoa(p.port), "--bind", "127.0.0.1",
		"--save", "", "--dir", p.dir, "--logfile", filepath.Join(p.dir, "redis.log")}, aof...)
	if p.args != nil {
		args = p.args
	}
	p.cmd = exec.Command("redis-server", args...)
	if err := p.cmd.Start(); err != nil {
		p.tb.Fatalf("start redis-server: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", p.Addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			p.checkOwnPort()
			return
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(p.dir, "redis.log"))
			p.tb.Fatalf("redis-server on %s not ready: %v\n%s", p.Addr, err, log)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// checkOwnPort fails the test when the server answering on the port is
// not the one just started (another process's port, taken in the moment
// between freePort and the start: this server could not bind it).
func (p *RedisProcess) checkOwnPort() {
	p.tb.Helper()
	c := redis.NewClient(&redis.Options{Addr: p.Addr, DialTimeout: time.Second, ReadTimeout: 5 * time.Second, MaxRetries: 3})
	defer c.Close()
	info, err := c.Info(context.Background(), "server").Result()
	if err != nil && strings.Contains(err.Error(), "LOADING") {
		return // (a durable server loading its file: ours)
	}
	if err == nil && !strings.Contains(info, "process_id:"+strconv.Itoa(p.cmd.Process.Pid)+"\r") {
		log, _ := os.ReadFile(filepath.Join(p.dir, "redis.log"))
		p.tb.Fatalf("port %d answers for another process than the redis-server started on it:\n%s", p.port, log)
	}
}

// Kill stops the server with SIGKILL and waits for it to exit.
func (p *RedisProcess) Kill() {
	if p.cmd == nil || p.cmd.Process == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	_ = p.cmd.Process.Kill()
	_ = p.cmd.Wait()
	p.cmd = nil
}

// Pause stops the process (SIGSTOP): connections stay open, nothing answers.
func (p *RedisProcess) Pause() { p.signal(syscall.SIGSTOP) }

// Resume continues a paused process (SIGCONT).
func (p *RedisProcess) Resume() { p.signal(syscall.SIGCONT) }

func (p *RedisProcess) signal(sig syscall.Signal) {
	p.tb.Helper()
	if p.cmd == nil {
		p.tb.Fatalf("redis-server on %s is not running", p.Addr)
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.tb.Fatalf("signal %v to redis-server: %v", sig, err)
	}
}

// String names the process for messages.
func (p *RedisProcess) String() string { return fmt.Sprintf("redis-server %s", p.Addr) }
