package main

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"time"

	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/lock/lockdriver"
	"github.com/oncekit/oncekit/storage"
	_ "github.com/oncekit/oncekit/storage/all" // oncectl takes every store URL
)

// store is what oncectl needs of a driver.
type store interface {
	lockdriver.Inspector
	idemdriver.Inspector
	Ping(ctx context.Context) error
}

// opened is a store and what closes it and its clients.
type opened struct {
	store
	full  storage.Store // the driver's Store: a lock.Locker and an idemdriver.Store too
	close func()
}

// storeHelp is storage.Help with what oncectl adds (it imports every
// driver).
var storeHelp = storage.Help() + `
memory:// stores live inside one process; oncectl cannot reach them.`

// openStore connects to the store named by raw (see storeHelp).
func openStore(raw string, timeout time.Duration) (*opened, error) {
	if raw == "" {
		return nil, errors.New("no store: pass --store URL or set ONCEKIT_STORE")
	}
	if u, err := url.Parse(raw); err == nil && (u.Scheme == "memory" || u.Scheme == "mem") {
		return nil, errors.New("memory:// stores live inside one process; oncectl cannot reach them " +
			"(use lockdriver.Inspector and idemdriver.Inspector in that process)")
	}
	s, err := storage.Open(context.Background(), raw, storage.WithTimeout(timeout))
	if err != nil {
		if !strings.Contains(err.Error(), "Store URLs:") {
			return nil, err
		}
		return nil, errors.New(strings.Replace(err.Error(), storage.Help(), storeHelp, 1))
	}
	return &opened{store: s, full: s, close: func() { _ = s.Close() }}, nil
}
