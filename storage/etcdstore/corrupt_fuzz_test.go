package etcdstore_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/internal/testenv"
)

var fuzzKeys atomic.Int64

// FuzzCorruptRecord plants arbitrary entries, through the real server, in
// an idempotency record's directory and claims its key: Begin never
// panics and never treats the key as free, and the Guard never runs.
func FuzzCorruptRecord(f *testing.F) {
	f.Add("planted", []byte("garbage"))
	f.Add("c", []byte{})
	f.Add("c", []byte("\x01\x00"))
	f.Add("i/token", []byte("fp"))
	f.Add("", []byte("x"))
	f.Add("a/b/c", []byte("\xff"))
	eps := testenv.EtcdAddrs(f)
	admin := newClient(f, eps)
	store := newStore(f, newClient(f, eps))
	g, err := idem.NewGuard(store)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, name string, value []byte) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		key := fmt.Sprintf("fuzz-%d-%d", time.Now().UnixNano(), fuzzKeys.Add(1))
		dir := "oncekit/idem/" + url.PathEscape(key) + "/"
		if _, err := admin.Put(ctx, dir+name, string(value)); err != nil {
			t.Fatal(err)
		}
		defer admin.Delete(context.Background(), dir+name)

		c, err := store.Begin(ctx, idemdriver.MustKey(key), "fp", time.Second)
		switch {
		case errors.Is(err, idem.ErrCorruptRecord):
			if ck, _, ok := idemdriver.CorruptRecordOf(err); !ok || ck != key {
				t.Fatalf("corrupt record error %v does not name the key", err)
			}
		case errors.Is(err, idem.ErrUnknownLayout): // a later version's layout: left alone
		case err != nil:
			t.Fatalf("Begin: %v", err)
		case c.State == idemdriver.Acquired:
			_ = store.Abandon(ctx, c)
			t.Fatalf("a planted entry %q = %q was taken for a free key", name, value)
		}
		ran := false
		_, _, _ = g.Do(ctx, key, "fp", func(context.Context) ([]byte, error) { ran = true; return nil, nil })
		if ran {
			t.Fatal("the Guard ran over a planted entry")
		}
	})
}
