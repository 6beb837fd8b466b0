package testenv

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/oncekit/oncekit/core/idem"
)

// CheckRunEndsWhenCut runs a Guard over via, a Store whose connection goes
// through p, and cuts that connection (p.Stall) in the middle of the run,
// after its first extension: the run's context must be done before a
// Store of another process (other, connected directly) can claim the key.
func CheckRunEndsWhenCut(t *testing.T, via, other idem.Store, p *Proxy) {
	t.Helper()
	const lease = 1200 * time.Millisecond
	g, err := idem.NewGuard(via, idem.WithLease(lease))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	key := idem.ScopedKey("cut", t.Name()+time.Now().Format(time.RFC3339Nano))
	started := make(chan struct{})
	ended := make(chan time.Time, 1)
	runErr := make(chan error, 1)
	go func() {
		_, _, err := g.Do(ctx, key, "fp", func(rctx context.Context) ([]byte, error) {
			close(started)
			select {
			case <-rctx.Done():
				ended <- time.Now()
			case <-ctx.Done():
			}
			return []byte("late"), nil
		})
		runErr <- err
	}()
	<-started
	time.Sleep(lease / 2) // one extension, at lease/3
	p.Stall()
	defer p.Resume()
	var began time.Time
	for began.IsZero() {
		c, err := other.Begin(ctx, key, "fp", lease)
		switch {
		case err != nil:
			t.Fatalf("another process's Begin: %v", err)
		case c.State == idem.Acquired:
			began = time.Now()
			defer other.Abandon(context.Background(), c)
		default:
			time.Sleep(time.Millisecond)
		}
	}
	select {
	case end := <-ended:
		t.Logf("run ended %s before another process claimed the key", began.Sub(end).Round(time.Millisecond))
	default:
		t.Fatal("another process claimed the key while the cut-off run was still going: two runs at once")
	}
	p.Resume()
	if err := <-runErr; !errors.Is(err, idem.ErrLockLost) {
		t.Errorf("Do whose claim ran out: %v, want ErrLockLost", err)
	}
}
