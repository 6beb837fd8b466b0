package idem_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"testing"

	"github.com/oncekit/oncekit/core/idem"
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
		{idem.KafkaScope("billing", "orders"), "", "msg-1", "sku-9", "{sku-9}idem:1f0279e0d13d64d6d728eb4faa3fee8ecfbb5be4d2bbd75b4fe978650d56e46d"},
	} {
		got, err := idem.StoredKey(c.scope, c.method, c.key, c.place)
		if err != nil || got != c.want {
			t.Errorf("StoredKey(%q, %q, %q, %q) = %q, %v; want %q", c.scope, c.method, c.key, c.place, got, err, c.want)
		}
	}
	if a, b := idem.ScopedKey("alice", "/shop.Orders/Place\norder-1"), "idem:c1cc1cf607b02a1d7efb8e672b578aa3877655ee2651df0e6c4e6e31c9e78ed6"; a != b {
		t.Errorf("the gRPC key is not ScopedKey(scope, method+\"\\n\"+key): %s", a)
	}
	if _, err := idem.StoredKey("alice", "", "k", "a{b"); err == nil {
		t.Error("StoredKey placed a key at a place with a brace")
	}
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
