package idem_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"strings"
	"testing"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/lock"
)

// The stored keys never change: records written by one version are found
// by the next only while every transport derives the same key. These are
// the keys of today's formula; a change here is a format break (see
// CONTRIBUTING.md).
func TestStoredKeyNeverChanges(t *testing.T) {
	for _, c := range []struct {
		scope, method, key, place, want string
	}{
		{"alice", "", "order-1", "", "idem:cdd93c91617d632c98ec5203d8891592d1fd14c1000c1bcffc5832585ce633a0"},
		{"alice", "/shop.Orders/Place", "order-1", "", "idem:c1cc1cf607b02a1d7efb8e672b578aa3877655ee2651df0e6c4e6e31c9e78ed6"},
		{idemdriver.KafkaScope("billing", "orders"), "", "msg-1", "sku-9", "{sku-9}idem:1f0279e0d13d64d6d728eb4faa3fee8ecfbb5be4d2bbd75b4fe978650d56e46d"},
	} {
		got, err := idemdriver.StoredKey(c.scope, c.method, c.key, c.place)
		if err != nil || got.String() != c.want || got.Place() != c.place {
			t.Errorf("StoredKey(%q, %q, %q, %q) = %q (place %q), %v; want %q", c.scope, c.method, c.key, c.place, got, got.Place(), err, c.want)
		}
	}
	if a, b := idemdriver.ScopedKey("alice", "/shop.Orders/Place\norder-1"), "idem:c1cc1cf607b02a1d7efb8e672b578aa3877655ee2651df0e6c4e6e31c9e78ed6"; a != b {
		t.Errorf("the gRPC key is not ScopedKey(scope, method+\"\\n\"+key): %s", a)
	}
	if _, err := idemdriver.StoredKey("alice", "", "k", "a{b"); err == nil {
		t.Error("StoredKey placed a key at a place with a brace")
	}
}

// A Key is checked once, when it is made, and knows its place from then
// on: the place CheckKey finds in a text is PlaceOf's, StoredKey's Key
// has the place it was given and reads back the same from its text, and
// the zero Key — the one Key not made by them — is refused.
func TestKeyChecksOnceAndKeepsItsPlace(t *testing.T) {
	long := strings.Repeat("p", idemdriver.MaxPlaceLen)
	for _, c := range []struct{ text, place, rest string }{
		{"order-1", "", "order-1"},
		{"{sku-1}order-1", "sku-1", "order-1"},
		{"{sku-1}", "sku-1", ""},
		{"{}order", "", "{}order"},                   // an empty tag places nothing
		{"{" + long + "}x", long, "x"},               // the longest place
		{"{" + long + "p}x", "", "{" + long + "p}x"}, // one byte longer: not placed
		{"x{sku}", "", "x{sku}"},                     // a tag elsewhere is not a place
		{strings.Repeat("k", 512), "", strings.Repeat("k", 512)},
	} {
		k, err := idemdriver.CheckKey(c.text)
		if err != nil || k.String() != c.text || k.Place() != c.place || k.Rest() != c.rest || k.IsZero() || k.Check() != nil {
			t.Errorf("CheckKey(%q) = %q place %q rest %q, %v; want place %q rest %q", c.text, k, k.Place(), k.Rest(), err, c.place, c.rest)
		}
		if p, ok := idemdriver.PlaceOf(c.text); p != c.place || ok != (c.place != "") {
			t.Errorf("PlaceOf(%q) = %q, %v; CheckKey found %q", c.text, p, ok, c.place)
		}
	}
	for _, bad := range []string{"", strings.Repeat("k", 513)} {
		if _, err := idemdriver.CheckKey(bad); !errors.Is(err, lock.ErrInvalidKey) {
			t.Errorf("CheckKey of %d bytes: %v, want lock.ErrInvalidKey", len(bad), err)
		}
	}
	var zero idemdriver.Key
	if !zero.IsZero() || !errors.Is(zero.Check(), lock.ErrInvalidKey) || zero.Place() != "" {
		t.Errorf("the zero Key: IsZero %v, Check %v", zero.IsZero(), zero.Check())
	}
	sk, err := idemdriver.StoredKey("alice", "", "order-1", "sku-1")
	if err != nil {
		t.Fatal(err)
	}
	if again := idemdriver.MustKey(sk.String()); again != sk {
		t.Errorf("CheckKey(StoredKey's text) = %#v, StoredKey gave %#v", again, sk)
	}
	defer func() {
		if recover() == nil {
			t.Error("MustKey(\"\") did not panic")
		}
	}()
	idemdriver.MustKey("")
}

// A fingerprint is stored with its record, and compared with the
// duplicate's: it never changes either. It is the hex SHA-256 of the
// parts, each after its length as 8 big-endian bytes — small requests and
// bodies over a kilobyte alike.
func TestFingerprintNeverChanges(t *testing.T) {
	big := bytes.Repeat([]byte("0123456789"), 300)
	for _, parts := range [][][]byte{
		{[]byte("POST"), []byte("/orders"), []byte(`{"sku":"phone-x"}`)},
		{[]byte("/shop.Orders/Place"), big},
		{},
	} {
		h := sha256.New()
		for _, p := range parts {
			h.Write(binary.BigEndian.AppendUint64(nil, uint64(len(p))))
			h.Write(p)
		}
		if got, want := idem.Fingerprint(parts...), hex.EncodeToString(h.Sum(nil)); got != want {
			t.Errorf("Fingerprint of %d parts = %s, want %s", len(parts), got, want)
		}
	}
}
