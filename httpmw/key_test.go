package httpmw_test

import (
	"strings"
	"testing"

	"github.com/oncekit/oncekit/httpmw"
)

func TestParseKey(t *testing.T) {
	for in, want := range map[string]string{
		"abc":                "abc",
		`"abc"`:              "abc",
		`"a\"b"`:             `a"b`,
		`"a\\b"`:             `a\b`,
		"8e03978e-40d5-43e8": "8e03978e-40d5-43e8",
		`a"b`:                `a"b`, // bare: any visible ASCII
	} {
		if got, err := httpmw.ParseKey(in); err != nil || got != want {
			t.Errorf("ParseKey(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", `""`, " a", "a\tb", "\x7f", "é", `"a`, `"a"b`, `"a\b"`, `"a" `, `"a";x=1`, strings.Repeat("x", 256), `"` + strings.Repeat("x", 256) + `"`} {
		if got, err := httpmw.ParseKey(in); err == nil {
			t.Errorf("ParseKey(%q) = %q, want an error", in, got)
		}
	}
}

// FuzzParseKey: no input panics; an accepted key is 1–255 bytes of visible
// ASCII; a bare key and its structured-field quoted form are the same key.
func FuzzParseKey(f *testing.F) {
	for _, s := range []string{"abc", `"abc"`, `"a\"b"`, `"a\\b"`, "", `""`, `"`, `"\`, "a b", "\x00", "é", strings.Repeat("k", 255)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		k, err := httpmw.ParseKey(in)
		if err != nil {
			return
		}
		if len(k) == 0 || len(k) > httpmw.MaxKeyLen {
			t.Fatalf("ParseKey(%q) accepted a key of %d bytes", in, len(k))
		}
		for i := 0; i < len(k); i++ {
			if k[i] < 0x21 || k[i] > 0x7e {
				t.Fatalf("ParseKey(%q) accepted byte %q", in, k[i])
			}
		}
		if !strings.HasPrefix(in, `"`) {
			quoted := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(k) + `"`
			if q, err := httpmw.ParseKey(quoted); err != nil || q != k {
				t.Fatalf("bare %q and quoted %q differ: %q, %v", in, quoted, q, err)
			}
		}
	})
}
