package rediskit_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/core/lock/lockdriver"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/storage/internal/bg"
	"github.com/oncekit/oncekit/storage/internal/rediskit"
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

// A grant that reached this Store after its waiter left is given back;
// one on another member's channel, or a message that is not a grant, is
// not acted on.
func TestReleaseOrphanGrant(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: testenv.RedisAddrs(t, 1)[0]})
	defer c.Close()
	var b rediskit.Base
	prefix := fmt.Sprintf("orphan-test:%d:", time.Now().UnixNano())
	b.Init(rediskit.Options{Prefix: prefix, RecordPrefix: prefix + "idem:", Recheck: time.Second,
		MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond})
	defer b.BG.Wait()
	ctx := context.Background()
	take := func(key, tok string) {
		t.Helper()
		r, err := b.Acquire(ctx, c, rediskit.AcquireArgs{Key: key, Token: tok, TTL: time.Minute}, nil)
		if err != nil || r.Code != rediskit.AcquireTaken {
			t.Fatalf("acquire %s: %+v %v", key, r, err)
		}
	}
	held := func(key string) bool {
		st, err := b.InspectLock(ctx, c, key)
		if err != nil {
			t.Fatal(err)
		}
		return st.Token != ""
	}
	take("a", "tok-a")
	b.ReleaseOrphanGrant(ctx, c, b.Keys.MemberChannel("a", "someone-else"), "g|tok-a|1|1")
	b.ReleaseOrphanGrant(ctx, c, b.Keys.MemberChannel("a", b.Member), "tok-a") // a plain wake, not a grant
	if !held("a") {
		t.Fatal("a message that was not this Store's grant released the key")
	}
	b.ReleaseOrphanGrant(ctx, c, b.Keys.MemberChannel("a", b.Member), "g|tok-a|1|1")
	if held("a") {
		t.Error("an orphan grant was not given back")
	}
}
