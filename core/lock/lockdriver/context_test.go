package lockdriver_test

import (
	"context"
	"testing"
	"time"

	"github.com/oncekit/oncekit/core/lock/lockdriver"
)

type ctxKey struct{}

func TestDeadlineOnly(t *testing.T) {
	parent, cancelParent := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "v"))
	bounded, cancel := lockdriver.BoundedContext(parent, time.Now().Add(time.Minute))
	defer cancel()
	cancelParent() // the bounded context does not follow its parent
	if err := bounded.Err(); err != nil {
		t.Fatalf("a BoundedContext ended with its parent: %v", err)
	}
	if bounded.Value(ctxKey{}) != "v" {
		t.Error("a BoundedContext lost its parent's values")
	}
	cleanup, cancelCleanup := lockdriver.CleanupContext(parent)
	defer cancelCleanup()
	own, cancelOwn := context.WithCancel(bounded)
	defer cancelOwn()
	timed, cancelTimed := context.WithTimeout(context.Background(), time.Minute)
	defer cancelTimed()
	for _, c := range []struct {
		name string
		ctx  context.Context
		want bool
	}{
		{"Background", context.Background(), true},
		{"WithoutCancel", context.WithoutCancel(parent), true},
		{"BoundedContext", bounded, true},
		{"CleanupContext", cleanup, true},
		{"values added to a BoundedContext", context.WithValue(bounded, ctxKey{}, "w"), true},
		{"a cancel of its own over a BoundedContext", own, false},
		{"WithTimeout", timed, false},
		{"a cancelled parent", parent, false},
	} {
		if got := lockdriver.DeadlineOnly(c.ctx); got != c.want {
			t.Errorf("DeadlineOnly(%s) = %v, want %v", c.name, got, c.want)
		}
	}
	short, cancelShort := lockdriver.BoundedContext(context.Background(), time.Now().Add(10*time.Millisecond))
	defer cancelShort()
	<-short.Done()
	if short.Err() != context.DeadlineExceeded {
		t.Errorf("a BoundedContext past its deadline: %v", short.Err())
	}
}
