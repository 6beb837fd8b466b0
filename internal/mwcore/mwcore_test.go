package mwcore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/internal/mwcore"
	"github.com/oncekit/oncekit/storage/memstore"
)

// The key space is chosen exactly once; a negative wait is refused.
func TestCheck(t *testing.T) {
	var none, one, two, badWait mwcore.Config
	one.ChooseScope()
	two.ChooseScope()
	two.ChooseScope()
	badWait.ChooseScope()
	badWait.SetWait(-time.Second)
	for name, c := range map[string]*mwcore.Config{"none": &none, "two": &two, "negative wait": &badWait} {
		if c.Check() == nil {
			t.Errorf("%s: Check passed", name)
		}
	}
	if err := one.Check(); err != nil {
		t.Errorf("one scope: %v", err)
	}
	ctx := one.Context(context.Background())
	if ctx != context.Background() {
		t.Error("Context changed ctx without a wait override")
	}
}

// Every refusal of the Guard reads as one case, whatever wraps it.
func TestRefused(t *testing.T) {
	var closed, open mwcore.Config
	open.SetFailOpen()
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	down := errors.New("dial tcp: connection refused")
	for _, tc := range []struct {
		c     *mwcore.Config
		ctx   context.Context
		err   error
		want  mwcore.Refusal
		after time.Duration
	}{
		{&closed, context.Background(), inFlightFor(t, time.Hour), mwcore.InFlight, time.Hour},
		{&closed, context.Background(), fmt.Errorf("x: %w", idem.ErrMismatch), mwcore.Mismatch, 0},
		{&closed, context.Background(), lock.ErrInvalidKey, mwcore.InvalidKey, 0},
		{&closed, context.Background(), idemdriver.CorruptRecord("k", ""), mwcore.CorruptRecord, 0},
		{&closed, gone, down, mwcore.Canceled, 0},
		{&open, context.Background(), down, mwcore.FailOpen, 0},
		{&closed, context.Background(), down, mwcore.StoreDown, 0},
	} {
		// (A hint is what is left of the running claim's TTL: a little
		// less than the TTL.)
		if got, after := tc.c.Refused(tc.ctx, tc.err); got != tc.want || after > tc.after || after < tc.after-time.Minute {
			t.Errorf("Refused(%v) = %v, %v; want %v, %v", tc.err, got, after, tc.want, tc.after)
		}
	}
}

func TestUnsettledBy(t *testing.T) {
	for err, want := range map[error]mwcore.Unsettled{
		fmt.Errorf("x: %w", lock.ErrLockLost):                    mwcore.Lost,
		&idem.EffectRefusedError{Key: "k", Reason: "sold_out"}:   mwcore.EffectRefused,
		&idem.EffectFailedError{Key: "k", Err: errors.New("no")}: mwcore.NotCommitted,
		fmt.Errorf("x: %w", idem.ErrResultTooLarge):              mwcore.NotCommitted,
		errors.New("i/o timeout"):                                mwcore.Unreachable,
	} {
		if got := mwcore.UnsettledBy(err); got != want {
			t.Errorf("UnsettledBy(%v) = %v, want %v", err, got, want)
		}
	}
}

// inFlightFor is the error a duplicate gets while a run holds its key with
// a TTL of ttl.
func inFlightFor(t *testing.T, ttl time.Duration) error {
	g, err := idem.NewGuard(memstore.New(), idem.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	running, release := make(chan struct{}), make(chan struct{})
	defer close(release)
	go func() {
		_, _, _ = g.Do(context.Background(), "k", "fp", func(context.Context) ([]byte, error) {
			close(running)
			<-release
			return nil, nil
		})
	}()
	<-running
	_, _, err = g.Do(context.Background(), "k", "fp", func(context.Context) ([]byte, error) { return nil, nil })
	return err
}
