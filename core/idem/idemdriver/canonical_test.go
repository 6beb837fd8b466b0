package idemdriver_test

import (
	"testing"

	"github.com/oncekit/oncekit/core/idem/idemdriver"
)

func TestCanonicalJSON(t *testing.T) {
	same := []string{
		`{"sku":"tv-1","qty":1,"user":{"id":"u1","tags":["a","b"]}}`,
		"{ \"user\" : {\"tags\":[\"a\", \"b\"], \"id\":\"u1\"},\n  \"qty\": 1,\t\"sku\": \"tv-\\u0031\" }",
	}
	want := `{"qty":1,"sku":"tv-1","user":{"id":"u1","tags":["a","b"]}}`
	for _, in := range same {
		got, err := idemdriver.CanonicalJSON([]byte(in))
		if err != nil || string(got) != want {
			t.Errorf("CanonicalJSON(%s) = %s, %v; want %s", in, got, err, want)
		}
	}
	for in, want := range map[string]string{
		`1.0`:           `1.0`, // numbers keep their text
		`"<&>"`:         `"<&>"`,
		`[]`:            `[]`,
		`{}`:            `{}`,
		`null`:          `null`,
		`[1, {"b":{}}]`: `[1,{"b":{}}]`,
	} {
		if got, err := idemdriver.CanonicalJSON([]byte(in)); err != nil || string(got) != want {
			t.Errorf("CanonicalJSON(%s) = %s, %v; want %s", in, got, err, want)
		}
	}
	for _, bad := range []string{``, `{`, `{"a":1,"a":2}`, `1 2`, `{"a":1}x`, `[1,]`, `nul`} {
		if got, err := idemdriver.CanonicalJSON([]byte(bad)); err == nil {
			t.Errorf("CanonicalJSON(%q) = %s, want an error", bad, got)
		}
	}
}

// FuzzCanonicalJSON: whatever the input, an error or a canonical form that
// is its own canonical form (never a panic).
func FuzzCanonicalJSON(f *testing.F) {
	for _, s := range []string{`{"b":1,"a":[true,null,"x"]}`, `1e3`, `"\u00e9"`, `{"a":{"a":{}}}`, `[`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := idemdriver.CanonicalJSON(b)
		if err != nil {
			return
		}
		again, err := idemdriver.CanonicalJSON(c)
		if err != nil || string(again) != string(c) {
			t.Fatalf("canonical form %s is not stable: %s, %v", c, again, err)
		}
	})
}
