package rediskit_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/core/lock/lockdriver"
	"github.com/oncekit/oncekit/internal/bg"
	"github.com/oncekit/oncekit/internal/rediskit"
	"github.com/oncekit/oncekit/internal/testenv"
)

// Run returns when its context ends, whatever the client's own timeouts
// (10 s here), on a paused server: for a deadline-only context on a client
// that enforces deadlines (run on the caller's goroutine), and otherwise
// (run on a background goroutine).
func TestRunEndsWithContextOnPausedServer(t *testing.T) {
	srv := testenv.StartRedis(t)
	enforcing := redis.NewClient(&redis.Options{Addr: srv.Addr, ReadTimeout: 10 * time.Second, ContextTimeoutEnabled: true})
	defer enforcing.Close()
	plain := redis.NewClient(&redis.Options{Addr: srv.Addr, ReadTimeout: 10 * time.Second})
	defer plain.Close()
	if !rediskit.EnforcesDeadlines(enforcing) || !rediskit.EnforcesDeadlines(rediskit.AutoPipeline(enforcing)) ||
		rediskit.EnforcesDeadlines(plain) {
		t.Fatal("EnforcesDeadlines misreads ContextTimeoutEnabled")
	}
	for _, c := range []*redis.Client{enforcing, plain} {
		if err := echo.Run(context.Background(), c, []string{"k"}, 1).Err(); err != nil {
			t.Fatal(err)
		}
	}
	srv.Pause()
	var wg bg.Group // the requests left running in the background
	defer func() {
		srv.Resume()
		wg.Wait()
	}()
	cases := []struct {
		name   string
		client redis.Scripter
		ctx    func() (context.Context, context.CancelFunc)
	}{
		{"deadline-only, enforcing client", rediskit.AutoPipeline(enforcing), func() (context.Context, context.CancelFunc) {
			return lockdriver.BoundedContext(context.Background(), time.Now().Add(200*time.Millisecond))
		}},
		{"deadline-only, plain client", plain, func() (context.Context, context.CancelFunc) {
			return lockdriver.BoundedContext(context.Background(), time.Now().Add(200*time.Millisecond))
		}},
		{"cancelled, enforcing client", enforcing, func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(200*time.Millisecond, cancel)
			return ctx, cancel
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := c.ctx()
			defer cancel()
			start := time.Now()
			err := rediskit.Run(ctx, &wg, c.client, echo, []string{"k"}, nil, 1).Err()
			if took := time.Since(start); took > 5*time.Second {
				t.Errorf("returned after %s: the context ended at 200 ms", took)
			}
			if !errors.Is(err, ctx.Err()) || ctx.Err() == nil {
				t.Errorf("error %v, want one matching the context's (%v)", err, ctx.Err())
			}
		})
	}
}
