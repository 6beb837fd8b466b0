package idem_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/storage/memstore"
	"github.com/oncekit/oncekit/storage/redisstore"
)

// A caller of Do tells the store failing (an unreachable server, a closed
// store: *idem.StoreError, errors.Is(err, idem.ErrStore)) from its own run
// failing (the run's error, as it returned it) and from the application's
// answers (a refused effect, a duplicate in flight, a reused key).
func TestStoreFailureIsTellableFromRunFailure(t *testing.T) {
	ctx := t.Context()
	errRun := errors.New("the payment provider said no")

	// The run's own error: not a store error.
	store := memstore.New()
	defer store.Close()
	g, err := idem.NewGuard(store)
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = g.Do(ctx, "k-run", "fp", func(context.Context) ([]byte, error) { return nil, errRun })
	if !errors.Is(err, errRun) || errors.Is(err, idem.ErrStore) {
		t.Errorf("a failed run: %v (store error: %v)", err, errors.Is(err, idem.ErrStore))
	}
	// A refused effect: the application's answer.
	_, _, err = g.Do(ctx, "k-refused", "fp", func(ctx context.Context) ([]byte, error) {
		return []byte("x"), idem.Commit(ctx, memstore.Effect(func() error { return errors.New("sold_out") }))
	})
	if !errors.Is(err, idem.ErrEffectRefused) || errors.Is(err, idem.ErrStore) {
		t.Errorf("a refused effect: %v (store error: %v)", err, errors.Is(err, idem.ErrStore))
	}

	// A Redis server nobody listens on: the claim fails in the store.
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer c.Close()
	rs, err := redisstore.New(c)
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	g, err = idem.NewGuard(rs)
	if err != nil {
		t.Fatal(err)
	}
	ran := false
	_, _, err = g.Do(ctx, "k-down", "fp", func(context.Context) ([]byte, error) { ran = true; return nil, nil })
	var se *idem.StoreError
	if ran || !errors.Is(err, idem.ErrStore) || !errors.As(err, &se) || se.Op != "begin" {
		t.Errorf("an unreachable store: ran %v, %v (%T)", ran, err, err)
	}

	// A real Redis that stops answering while the run goes on (its
	// traffic stalled): the completion fails in the store.
	p := testenv.StartProxy(t, testenv.RedisAddrs(t, 1)[0])
	pc := redis.NewClient(&redis.Options{Addr: p.Addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer pc.Close()
	cs, err := redisstore.New(pc)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	g, err = idem.NewGuard(cs, idem.WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = g.Do(ctx, "k-cut-"+time.Now().Format("150405.000000"), "fp", func(context.Context) ([]byte, error) {
		p.Stall()
		return []byte("done"), nil
	})
	p.Resume()
	if !errors.Is(err, idem.ErrStore) || !errors.As(err, &se) || se.Op != "complete" {
		t.Errorf("a store cut off under the run: %v (%T)", err, err)
	}
}
