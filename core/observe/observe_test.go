package observe_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/oncekit/oncekit/core/observe"
)

type recorder struct {
	name string
	log  *[]string
}

type ctxKey struct{}

func (r recorder) Start(ctx context.Context, ev observe.Event) context.Context {
	*r.log = append(*r.log, r.name+".start:"+string(ev.Op))
	return context.WithValue(ctx, ctxKey{}, r.name)
}

func (r recorder) End(ctx context.Context, ev observe.Event) {
	*r.log = append(*r.log, r.name+".end:"+string(ev.Outcome)+":"+ctx.Value(ctxKey{}).(string))
}

func (r recorder) Record(_ context.Context, ev observe.Event) {
	*r.log = append(*r.log, r.name+".record:"+string(ev.Op))
}

func TestMultiNestsAndUnwinds(t *testing.T) {
	var log []string
	m := observe.Multi(recorder{"a", &log}, nil, recorder{"b", &log})
	ctx, call := observe.Begin(context.Background(), m, observe.IdemBegin, "memory", "k")
	if ctx.Value(ctxKey{}) != "b" {
		t.Errorf("the operation's context comes from the last observer; got %v", ctx.Value(ctxKey{}))
	}
	call.End(observe.Acquired, 7, nil)
	observe.Record(ctx, m, observe.Event{Op: observe.LockLost})
	want := "a.start:idem.begin b.start:idem.begin b.end:acquired:b a.end:acquired:b a.record:lock.lost b.record:lock.lost"
	if got := strings.Join(log, " "); got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	if observe.Multi(nil, nil) != nil {
		t.Error("Multi of nothing is not nil")
	}
}

func TestNilObserverCostsNothing(t *testing.T) {
	ctx := context.Background()
	got, call := observe.Begin(ctx, nil, observe.LockAcquire, "", "k")
	if got != ctx {
		t.Error("Begin with a nil Observer changed the context")
	}
	call.End(observe.Acquired, 1, nil) // must not panic
	observe.Record(ctx, nil, observe.Event{})
	if allocs := testing.AllocsPerRun(100, func() {
		_, c := observe.Begin(ctx, nil, observe.LockAcquire, "", "k")
		c.End(observe.Acquired, 1, nil)
	}); allocs != 0 {
		t.Errorf("%v allocations per operation with no Observer", allocs)
	}
}

func TestLoggerHashesKeys(t *testing.T) {
	var buf bytes.Buffer
	l := observe.Logger(slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	l.End(context.Background(), observe.Event{Op: observe.IdemBegin, Driver: "redis", Key: "user-42:order-9",
		Outcome: observe.Replayed})
	l.Record(context.Background(), observe.Event{Op: observe.LockLost, Key: "user-42:order-9", Outcome: observe.Lost,
		Err: fmt.Errorf("redisstore: refresh %q: %w", "user-42:order-9", errors.New("lock lost"))})
	l.End(context.Background(), observe.Event{Op: observe.IdemComplete, Key: "user-42:order-9", Outcome: observe.Error,
		Err: errors.New("no quorum for user-42:order-9")})
	out := buf.String()
	if strings.Contains(out, "user-42") {
		t.Errorf("the raw key was logged: %s", out)
	}
	if !strings.Contains(out, observe.HashKey("user-42:order-9")) || !strings.Contains(out, `"level":"DEBUG"`) ||
		!strings.Contains(out, `"level":"WARN"`) || !strings.Contains(out, `"outcome":"replayed"`) {
		t.Errorf("log lines: %s", out)
	}
	if observe.Logger(nil) != nil {
		t.Error("Logger(nil) is not nil")
	}
}

// A refused effect (a sell-out) is logged as an answer, at Debug, never as
// a failure at Warn.
func TestLoggerRefusalIsNotAFailure(t *testing.T) {
	var buf bytes.Buffer
	l := observe.Logger(slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	l.End(context.Background(), observe.Event{Op: observe.IdemComplete, Driver: "redis", Key: "order-9",
		Outcome: observe.Refused, Err: errors.New("idem: effect refused: sold_out")})
	out := buf.String()
	if strings.Contains(out, `"level":"WARN"`) || strings.Contains(out, `"outcome":"error"`) || !strings.Contains(out, `"outcome":"refused"`) {
		t.Errorf("a refusal logged as %s", out)
	}
}
