package rediskit_test

import (
	"testing"

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
		if got := r.Record(key); got != want {
			t.Errorf("Record(%q) = %q, want %q", key, got, want)
		}
	}
	if a, b := r.Record("{a}:x}"), r.Record("{a}"); a == b {
		t.Errorf("two keys share the record %q", a)
	}
}
