package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/storage/internal/rediskit"
)

var fuzzKeys atomic.Int64

// FuzzCorruptRecord plants arbitrary bytes, through the real server, as an
// idempotency record — a hash with any fields, or another type — and
// claims its key. Whatever is planted, Begin never panics and never treats
// the key as free: it reports the record (in flight, completed, another
// fingerprint), idem.ErrCorruptRecord naming the key, or
// idem.ErrUnknownLayout for a record of another layout, and the Guard
// never runs.
func FuzzCorruptRecord(f *testing.F) {
	f.Add(uint8(0), "1", "c", "fp", "result", "tok", "12")
	f.Add(uint8(0), "1", "i", "fp", "", "tok", "x")
	f.Add(uint8(0), "2", "c", "fp", "r", "", "")
	f.Add(uint8(0), "1", "c", "fp", "", "", "")
	f.Add(uint8(0), "", "", "", "", "", "")
	f.Add(uint8(0), "1", "z", "fp", "r", "t", "-1")
	f.Add(uint8(1), "garbage", "", "", "", "", "")
	f.Add(uint8(1), "R1|i|17||tok|2|fp", "", "fp", "", "", "")
	f.Add(uint8(2), "a", "b", "", "", "", "")
	f.Add(uint8(0), "1", "c", "fp", "\x01\x00\xff\xff\xff\xff\x0f", "", "")
	admin := newClient(f)
	store := newStore(f, newClient(f))
	g, err := idem.NewGuard(store)
	if err != nil {
		f.Fatal(err)
	}
	records := rediskit.Records{Prefix: "oncekit:idem:"}
	f.Fuzz(func(t *testing.T, kind uint8, v, s, fp, r, tok, fence string) {
		ctx := context.Background()
		key := fmt.Sprintf("fuzz-%d-%d", time.Now().UnixNano(), fuzzKeys.Add(1))
		name := records.Record(idemdriver.MustKey(key))
		var err error
		switch kind % 3 {
		case 0:
			fields := []any{}
			for _, kv := range [][2]string{{"v", v}, {"s", s}, {"fp", fp}, {"r", r}, {"t", tok}, {"f", fence}} {
				if kv[1] != "" {
					fields = append(fields, kv[0], kv[1])
				}
			}
			if len(fields) == 0 {
				fields = []any{"x", "y"}
			}
			err = admin.HSet(ctx, name, fields...).Err()
		case 1:
			err = admin.Set(ctx, name, v, 0).Err()
		case 2:
			err = admin.RPush(ctx, name, v, s).Err()
		}
		if err != nil {
			t.Fatal(err)
		}
		defer admin.Del(ctx, name)
		admin.PExpire(ctx, name, time.Minute)

		c, err := store.Begin(ctx, idemdriver.MustKey(key), fp, time.Second)
		switch {
		case errors.Is(err, idem.ErrCorruptRecord):
			if ck, _, ok := idemdriver.CorruptRecordOf(err); !ok || ck != key {
				t.Fatalf("corrupt record error %v does not name the key", err)
			}
		case errors.Is(err, idem.ErrUnknownLayout): // "R<n>|…" of another layout: left alone
		case err != nil:
			t.Fatalf("Begin: %v", err)
		case c.State == idemdriver.Acquired:
			t.Fatalf("a planted record (%d %q %q %q) was taken for a free key", kind, v, s, fp)
		}
		ran := false
		_, _, _ = g.Do(ctx, key, fp, func(context.Context) ([]byte, error) { ran = true; return nil, nil })
		if ran {
			t.Fatal("the Guard ran over a planted record")
		}
	})
}
