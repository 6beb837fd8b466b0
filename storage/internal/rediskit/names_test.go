package rediskit_test

import (
	"testing"

	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/storage/internal/rediskit"
)

// A placed key's record carries its place as the hash tag; every other
// key is its own tag, braces escaped; the two forms never name one record.
func TestRecordNames(t *testing.T) {
	r := rediskit.Records{Prefix: "p:"}
	for key, want := range map[string]string{
		"idem:ab":       "p:{idem:ab}",
		"{sku-1}idem:a": "p:{sku-1}:idem:a",
		"{sku-1}}x":     "p:{sku-1}:%7Dx",
		"{}x":           "p:{%7B%7Dx}",
		"x{a}":          "p:{x%7Ba%7D}",
	} {
		if got := r.Record(idemdriver.MustKey(key)); got != want {
			t.Errorf("Record(%q) = %q, want %q", key, got, want)
		}
	}
	if a, b := r.Record(idemdriver.MustKey("{a}:x}")), r.Record(idemdriver.MustKey("{a}")); a == b {
		t.Errorf("two keys share the record %q", a)
	}
}

// KeyOf reverses Record, and refuses names that are no record's.
func TestRecordKeyOf(t *testing.T) {
	r := rediskit.Records{Prefix: "p:"}
	for _, key := range []string{"idem:ab", "{sku-1}idem:a", "{sku-1}}x", "{}x", "x{a}", "%7B", "a%b", "{a}:x}", "{a}"} {
		if got, ok := r.KeyOf(r.Record(idemdriver.MustKey(key))); !ok || got != key {
			t.Errorf("KeyOf(Record(%q)) = %q, %v", key, got, ok)
		}
	}
	for _, name := range []string{"q:{a}", "p:a", "p:{a", "p:{a}x", "p:{a%}", "p:{a%7}", "p:{a}:%2"} {
		if key, ok := r.KeyOf(name); ok {
			t.Errorf("KeyOf(%q) = %q, want no key", name, key)
		}
	}
}
