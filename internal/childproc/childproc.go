package childproc

import (
	"bufio"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Child is a started child process.
type Child struct {
	cmd    *exec.Cmd
	stderr lockedBuilder
}

// Start starts the test binary with env added to this process's
// environment and waits up to timeout for it to print ready on a line of
// its own. A line starting "error:", or the end of its output, before
// that fails tb with the child's standard error. The child is killed at
// tb's cleanup (continued first, if it was stopped).
func Start(tb testing.TB, env []string, ready string, timeout time.Duration) *Child {
	tb.Helper()
	c := &Child{cmd: exec.Command(os.Args[0], "-test.run=^$")}
	c.cmd.Env = append(os.Environ(), env...)
	c.cmd.Stderr = &c.stderr
	out, err := c.cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		_ = c.cmd.Process.Signal(syscall.SIGCONT)
		_ = c.cmd.Process.Kill()
		_ = c.cmd.Wait()
	})
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if line := sc.Text(); line == ready || strings.HasPrefix(line, "error:") {
				lines <- line
				return
			}
		}
		close(lines)
	}()
	select {
	case line := <-lines:
		if line != ready {
			_ = c.cmd.Wait()
			tb.Fatalf("child process: %q (%v), stderr:\n%s", line, c.cmd.ProcessState, c.stderr.String())
		}
	case <-time.After(timeout):
		tb.Fatalf("the child process did not say %q within %v; stderr:\n%s", ready, timeout, c.stderr.String())
	}
	return c
}

// Signal sends sig to the child.
func (c *Child) Signal(sig os.Signal) error { return c.cmd.Process.Signal(sig) }

// Wait waits for the child to exit.
func (c *Child) Wait() error { return c.cmd.Wait() }

// lockedBuilder is a strings.Builder safe for exec.Cmd's stderr copier
// and the test.
type lockedBuilder struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuilder) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuilder) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
