package memstore_test

import (
	"testing"

	"github.com/oncekit/oncekit/stock/stockdriver"
	"github.com/oncekit/oncekit/stock/stocktest"
	"github.com/oncekit/oncekit/storage/memstore"
)

func TestStock(t *testing.T) {
	s := memstore.New()
	stocktest.Run(t, stocktest.Config{NewStore: func(*testing.T) stockdriver.Store { return s }})
}
