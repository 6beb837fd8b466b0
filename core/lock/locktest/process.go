package locktest

import (
	"context"
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/internal/childproc"
)

// The holder process: HolderProcessFaults starts the test binary again
// with these variables set; the driver's TestMain calls RunHolder, which
// holds the key and waits to be killed or paused.
const (
	holderKeyEnv = "ONCEKIT_LOCKTEST_HOLDER_KEY"
	holderTTLEnv = "ONCEKIT_LOCKTEST_HOLDER_TTL"
)

// RunHolder is for a driver's TestMain. In the child process that the
// suite's HolderProcessFaults case starts, it takes the key the suite
// names with a Locker from newLocker, keeps it alive with a lock.Mutex
// (refreshing every TTL/3), reports "held" on stdout and waits to be
// killed; it never returns there. In any other process it returns at once.
//
//	func TestMain(m *testing.M) {
//		locktest.RunHolder(func() (lock.Locker, error) { return redisstore.New(client()) })
//		os.Exit(m.Run())
//	}
func RunHolder(newLocker func() (lock.Locker, error)) {
	key := os.Getenv(holderKeyEnv)
	if key == "" {
		return
	}
	ttl, err := time.ParseDuration(os.Getenv(holderTTLEnv))
	if err == nil {
		err = hold(newLocker, key, ttl)
	}
	fmt.Println("error:", err)
	os.Exit(3)
}

func hold(newLocker func() (lock.Locker, error), key string, ttl time.Duration) error {
	l, err := newLocker()
	if err != nil {
		return err
	}
	m, err := lock.NewMutex(l, lock.WithTTL(ttl))
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h, err := m.Lock(ctx, key)
	if err != nil {
		return err
	}
	fmt.Println("held")
	<-h.Lost() // kept alive until this process is killed or paused past its TTL
	return fmt.Errorf("lost: %w", h.Err())
}

// holderProcessFaults: a holder process killed with SIGKILL, and one
// paused with SIGSTOP, lose the key within their TTL (plus the driver's
// Lag): another process gets it then, on every driver — TTL means the same
// everywhere.
func (s *suite) holderProcessFaults(t *testing.T) {
	if !s.cfg.HolderProcess {
		return // an in-process driver: no other process shares its keys
	}
	const ttl = 2 * time.Second
	for _, fault := range []struct {
		name string
		sig  syscall.Signal
	}{{"killed", syscall.SIGKILL}, {"paused", syscall.SIGSTOP}} {
		t.Run(fault.name, func(t *testing.T) {
			// The Locker first: a driver whose servers are not configured
			// skips here, before a holder process is started that could
			// not reach them either. The holder inherits this process's
			// environment, and so the addresses the Locker was built from.
			other := s.cfg.NewLocker(t)
			k := key(t)
			env := append(append([]string{}, s.cfg.ProcessEnv...), holderKeyEnv+"="+k, holderTTLEnv+"="+ttl.String())
			child := childproc.Start(t, env, "held", 20*time.Second)
			time.Sleep(ttl / 2) // a refresh or two
			faulted := time.Now()
			if err := child.Signal(fault.sig); err != nil {
				t.Fatal(err)
			}
			l, err := other.Acquire(ctxTimeout(t, 30*time.Second), k, 10*time.Second)
			if err != nil {
				t.Fatalf("Acquire after the holder was %s: %v", fault.name, err)
			}
			freed := time.Since(faulted)
			t.Logf("holder %s: key taken by another process after %s (TTL %s)", fault.name, freed.Round(time.Millisecond), ttl)
			if limit := ttl + s.cfg.Lag + time.Second; freed > limit {
				t.Errorf("the key outlived its %s holder by %s: free after %s, limit TTL + lag + 1 s = %s",
					fault.name, freed-ttl, freed.Round(time.Millisecond), limit)
			}
			_ = l.Release(context.Background())
		})
	}
}
