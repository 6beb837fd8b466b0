package httpmw

import (
	"bytes"
	"slices"
	"strings"
	"testing"
)

// A header value over 64 KiB survives the round trip intact: with 2-byte
// lengths it wrapped, and the rest of the value was read as further
// headers (a Set-Cookie could be smuggled past the allowlist).
func TestLongHeaderValue(t *testing.T) {
	smuggled := "x\x00\x0aSet-Cookie\x00\x05evil=1"
	long := strings.Repeat("a", 65536) + smuggled
	in := response{status: 201, fields: []string{"Location", long}, body: []byte("body")}
	out, err := decodeResponse(in.encode())
	if err != nil {
		t.Fatal(err)
	}
	if len(out.fields) != 2 || out.fields[0] != "Location" || out.fields[1] != long {
		t.Fatalf("decoded headers %d; want the one Location value intact", len(out.fields)/2)
	}
	if out.status != 201 || !bytes.Equal(out.body, in.body) {
		t.Fatalf("decoded %d %q", out.status, out.body)
	}
}

// FuzzDecodeResponse: any stored bytes decode to a response or errCorrupt,
// never a panic, and what encode writes decodes to itself.
func FuzzDecodeResponse(f *testing.F) {
	f.Add(response{status: 200, fields: []string{"Content-Type", "application/json"}, body: []byte(`{"ok":true}`)}.encode())
	f.Add(response{status: 302, fields: []string{"Location", "/a", "Etag", `"1"`, "Etag", `"2"`}}.encode())
	f.Add([]byte{recordVersion})
	f.Add([]byte{1, 0, 200, 0, 0})
	f.Add([]byte{recordVersion, 0xc8, 0x01, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeResponse(b)
		if err != nil {
			return
		}
		if r.status < 100 || r.status > 999 {
			t.Fatalf("status %d decoded", r.status)
		}
		again, err := decodeResponse(r.encode())
		if err != nil || again.status != r.status || !bytes.Equal(again.body, r.body) || !slices.Equal(again.fields, r.fields) {
			t.Fatalf("re-encoding changed the response: %v", err)
		}
	})
}
