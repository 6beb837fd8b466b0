package redlockstore_test

import (
	"errors"
	"testing"

	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/stock"
	"github.com/oncekit/oncekit/storage/redlockstore"
)

func TestStockRefused(t *testing.T) {
	s := newStore(t, clients(t, testenv.RedisAddrs(t, 3)[:3]))
	if _, err := stock.New(s); !errors.Is(err, redlockstore.ErrNoStock) {
		t.Fatalf("stock.New(Redlock) = %v, want ErrNoStock", err)
	}
}
