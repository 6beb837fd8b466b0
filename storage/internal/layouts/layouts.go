package layouts

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/lock"
)

// Layout is one value as a released version of a driver stored it: a
// golden record or lock, which every later version must judge the same
// (see CONTRIBUTING.md, "Stored layouts").
type Layout struct {
	Name string `json:"name"`
	// What is "record" (an idempotency record) or "lock".
	What string `json:"what"`
	// Data is the driver's own: the stored value(s) and their expiry.
	Data json.RawMessage `json:"data"`
	// Want is what a reader makes of it: "in_flight" (another run holds
	// the key: a duplicate waits), "completed" (a duplicate gets Result),
	// "free" (the next claim takes it, as attempt Attempt, with a fence
	// above Fence), "unknown_layout" (idem.ErrUnknownLayout: never taken
	// over), "held" (a lock nobody else can take) or "lock_free" (a lock
	// the next Acquire takes, with a fence above Fence).
	Want        string `json:"want"`
	Fingerprint string `json:"fingerprint,omitempty"`
	Result      []byte `json:"result,omitempty"`
	Fence       uint64 `json:"fence,omitempty"`
	Attempt     int    `json:"attempt,omitempty"`
}

// Store is what Check asks: every oncekit driver.
type Store interface {
	idemdriver.Store
	lock.Locker
}

// Writing reports whether golden layout files are to be written
// (ONCEKIT_WRITE_LAYOUTS=1) rather than read: done once per released
// version, whose files then never change.
func Writing() bool { return os.Getenv("ONCEKIT_WRITE_LAYOUTS") == "1" }

// Write writes layouts to file (testdata/layouts/<version>.json).
func Write(t *testing.T, file string, layouts []Layout) {
	t.Helper()
	b, err := json.MarshalIndent(layouts, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, append(b, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
}

// Check reads every golden file under dir (one per released
// version) and, for each value, plants it under a fresh key (plant writes
// the driver's Data for key) and checks that store judges it as Want.
func Check(t *testing.T, dir string, store Store, plant func(t *testing.T, key string, l Layout)) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no golden layouts under %s (%v)", dir, err)
	}
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var layouts []Layout
		if err := json.Unmarshal(b, &layouts); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		for i, l := range layouts {
			t.Run(filepath.Base(file)+"/"+l.Name, func(t *testing.T) {
				key := "layout-" + strconv.FormatInt(time.Now().UnixNano(), 36) + "-" + strconv.Itoa(i)
				plant(t, key, l)
				checkLayout(t, store, key, l)
			})
		}
	}
}

func checkLayout(t *testing.T, store Store, key string, l Layout) {
	t.Helper()
	ctx := t.Context()
	begin := func(fp string) (idemdriver.Claim, error) {
		k, err := idemdriver.CheckKey(key)
		if err != nil {
			t.Fatal(err)
		}
		return store.Begin(ctx, k, fp, 10*time.Second)
	}
	switch l.Want {
	case "in_flight":
		if c, err := begin(l.Fingerprint); err != nil || c.State != idemdriver.InFlight {
			t.Errorf("a duplicate of a claim in flight: state %v, %v; want InFlight", c.State, err)
		}
		if c, err := begin(l.Fingerprint + "-other"); err != nil || c.State != idemdriver.Mismatch {
			t.Errorf("another request with its key: state %v, %v; want Mismatch", c.State, err)
		}
	case "completed":
		c, err := begin(l.Fingerprint)
		if err != nil || c.State != idemdriver.Completed || string(c.Result) != string(l.Result) {
			t.Errorf("a duplicate of a completed record: state %v, result %q, %v; want Completed with %q", c.State, c.Result, err, l.Result)
		}
	case "free":
		c, err := begin(l.Fingerprint)
		if err != nil || c.State != idemdriver.Acquired {
			t.Fatalf("a free record: state %v, %v; want Acquired", c.State, err)
		}
		defer store.Abandon(context.WithoutCancel(ctx), c)
		if c.Attempt != l.Attempt {
			t.Errorf("the next claim is attempt %d, want %d", c.Attempt, l.Attempt)
		}
		if c.Fence <= l.Fence {
			t.Errorf("the next claim's fence %d is not above the record's %d", c.Fence, l.Fence)
		}
	case "unknown_layout":
		c, err := begin(l.Fingerprint)
		if !errors.Is(err, idem.ErrUnknownLayout) {
			t.Errorf("a record of another layout: state %v, %v; want idem.ErrUnknownLayout", c.State, err)
		}
	case "held":
		if lease, err := store.TryAcquire(ctx, key, time.Second); !errors.Is(err, lock.ErrNotAcquired) {
			if err == nil {
				_ = lease.Release(ctx)
			}
			t.Errorf("a held lock: TryAcquire = %v, want lock.ErrNotAcquired", err)
		}
	case "lock_free":
		lease, err := store.TryAcquire(ctx, key, time.Second)
		if err != nil {
			t.Fatalf("a free lock: TryAcquire = %v", err)
		}
		defer lease.Release(context.WithoutCancel(ctx))
		if lease.Fence() != 0 && lease.Fence() <= l.Fence {
			t.Errorf("the next lease's fence %d is not above the lock's %d", lease.Fence(), l.Fence)
		}
	default:
		t.Fatalf("unknown want %q", l.Want)
	}
}
