package memstore_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/core/lock/locktest"
	"github.com/oncekit/oncekit/storage/memstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) {
	store := memstore.New()
	locktest.Run(t, locktest.Config{
		NewLocker: func(*testing.T) lock.Locker { return store },
		Reentrant: true,
	})
}
