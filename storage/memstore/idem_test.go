package memstore_test

import (
	"testing"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemtest"
	"github.com/oncekit/oncekit/storage/memstore"
)

func TestIdemConformance(t *testing.T) {
	store := memstore.New()
	idemtest.Run(t, idemtest.Config{
		NewStore: func(*testing.T) idem.Store { return store },
	})
}
