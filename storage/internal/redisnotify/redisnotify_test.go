package redisnotify_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/storage/internal/redisnotify"
)

// A channel stays subscribed for Linger after its last waiter left: a new
// waiter within it sends no SUBSCRIBE and is woken by the next message; a
// grant that arrives meanwhile goes to the orphan-grant function; after
// the linger the channel is unsubscribed.
func TestChannelLingers(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: testenv.RedisAddrs(t, 1)[0]})
	defer c.Close()
	ctx := context.Background()
	s := redisnotify.New(c, redisnotify.Classic)
	defer s.Close()
	orphans := make(chan string, 1)
	s.OnOrphanGrant(func(_, payload string) { orphans <- payload })
	name := fmt.Sprintf("linger-test:%d", time.Now().UnixNano())
	subscribers := func() int64 {
		t.Helper()
		n, err := c.PubSubNumSub(ctx, name).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n[name]
	}

	w, err := s.Watch(ctx, name)
	if err != nil || !w.Subscribed() {
		t.Fatalf("watch: %v, subscribed %v", err, w != nil && w.Subscribed())
	}
	s.Unwatch(w)
	if n := subscribers(); n != 1 {
		t.Fatalf("%d subscribers right after the last waiter left, want 1 (lingering)", n)
	}
	// A grant with nobody watching is an orphan.
	if err := c.Publish(ctx, name, redisnotify.GrantPrefix+"tok|7").Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case p := <-orphans:
		if p != redisnotify.GrantPrefix+"tok|7" {
			t.Errorf("orphan grant %q", p)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a grant to a lingering channel did not reach the orphan-grant function")
	}
	// Watched again within the linger: the subscription is reused.
	w, err = s.Watch(ctx, name)
	if err != nil || !w.Subscribed() {
		t.Fatalf("watch again: %v", err)
	}
	if n := subscribers(); n != 1 {
		t.Errorf("%d subscribers, want 1", n)
	}
	if err := c.Publish(ctx, name, "released").Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.Wake():
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter on a reused subscription was not woken")
	}
	// Its linger outlives its last waiter, then it is unsubscribed.
	s.Unwatch(w)
	deadline := time.Now().Add(redisnotify.Linger + 5*time.Second)
	for subscribers() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("still subscribed %s after the last waiter left", redisnotify.Linger+5*time.Second)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
