package kafkamw

import (
	"errors"
	"strings"
	"testing"

	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/lock"
)

// FuzzKeyOf: any message-id header is either a clear error or a stored key
// (never a panic, never the raw header), the same header always gives the
// same key, and two different valid headers never share one.
func FuzzKeyOf(f *testing.F) {
	for _, s := range []string{"order-1", "", " ", "a b", strings.Repeat("k", 255), strings.Repeat("k", 256), "\x00", "é", "\"quoted\""} {
		f.Add(s, "orders", false)
	}
	f.Add("", "orders", true)
	c := &Consumer{cfg: defaults()}
	c.cfg.scope = func(m Message) string { return "g\x00" + m.Topic }
	f.Fuzz(func(t *testing.T, id, topic string, noHeader bool) {
		msg := Message{Topic: topic, Partition: 3, Offset: 42}
		if !noHeader {
			msg.Headers = []Header{{Key: DefaultKeyHeader, Value: []byte(id)}}
		}
		key, err := c.keyOf(msg)
		valid := noHeader || idemdriver.CheckClientKey(id) == nil
		if (err == nil) != valid {
			t.Fatalf("header %q (present %v): key %q, error %v", id, !noHeader, key, err)
		}
		if err != nil {
			return
		}
		if !strings.HasPrefix(key.String(), "idem:") || len(key.String()) != 69 || (len(id) >= 16 && strings.Contains(key.String(), id)) {
			t.Fatalf("stored key %q is not a hashed key", key)
		}
		if again, _ := c.keyOf(msg); again != key {
			t.Fatal("the same message gave two keys")
		}
		if !noHeader {
			other := msg
			other.Headers = []Header{{Key: DefaultKeyHeader, Value: []byte(id + "x")}}
			if k2, err := c.keyOf(other); err == nil && k2 == key {
				t.Fatal("two message-ids share a key")
			}
		}
	})
}

// WithPlacement places the stored key by the message; a place that cannot
// be one is a bad key.
func TestKeyOfPlaced(t *testing.T) {
	c := &Consumer{cfg: defaults()}
	c.cfg.scope = func(m Message) string { return "g\x00" + m.Topic }
	c.cfg.place = func(m Message) string { return string(m.Key) }
	msg := Message{Topic: "orders", Key: []byte("tv-1"), Headers: []Header{{Key: DefaultKeyHeader, Value: []byte("m-1")}}}
	key, err := c.keyOf(msg)
	if p, ok := idemdriver.PlaceOf(key.String()); err != nil || !ok || p != "tv-1" {
		t.Errorf("keyOf = %q, %v; want it placed in tv-1", key, err)
	}
	msg.Key = []byte("a}b")
	if key, err := c.keyOf(msg); !errors.Is(err, lock.ErrInvalidKey) {
		t.Errorf("a place with a brace: %q, %v; want ErrInvalidKey", key, err)
	}
}
