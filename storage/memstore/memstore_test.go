package memstore_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/lock/locktest"
	"github.com/oncekit/oncekit/core/observe"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/storage/memstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) {
	t.Parallel()
	store := memstore.New()
	locktest.Run(t, locktest.Config{
		NewLocker: func(*testing.T) lock.Locker { return store },
		Reentrant: true,
	})
}

// A waiter reports the hand-off from the release.
func TestHandOffReported(t *testing.T) {
	ev := testenv.NewEvents()
	s := memstore.New(memstore.WithObserver(ev))
	testenv.CheckHandOff(t, s, s, ev, observe.Local)
}
