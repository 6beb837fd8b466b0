package idemdriver

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/oncekit/oncekit/core/internal/bounds"
	"github.com/oncekit/oncekit/core/lock"
)

// ScopedKey derives the stored key from a scope (a tenant, a principal, a
// method or route — whatever must never share results) and the caller's
// key: "idem:" and the hex SHA-256 of both, 69 bytes whatever their length.
// Scope and key are length-prefixed before hashing, so ("ab", "c") and
// ("a", "bc") differ. The raw key is never stored.
func ScopedKey(scope, key string) string { return scopedKey(scope, "", key) }

// scopedKey is ScopedKey(scope, method+"\n"+key), or ScopedKey(scope,
// key) when method is "", without building that string.
func scopedKey(scope, method, key string) string {
	var stack [512]byte
	b := appendPart(stack[:0], scope)
	n := len(key)
	if method != "" {
		n += len(method) + 1
	}
	b = binary.BigEndian.AppendUint64(b, uint64(n))
	if method != "" {
		b = append(append(b, method...), '\n')
	}
	b = append(b, key...)
	return hexKey("idem:", sha256.Sum256(b))
}

// hexKey is prefix and the hex of sum, in one allocation.
func hexKey(prefix string, sum [sha256.Size]byte) string {
	var out [16 + 2*sha256.Size]byte
	n := copy(out[:], prefix)
	hex.Encode(out[n:], sum[:])
	return string(out[:n+2*sha256.Size])
}

// StoredKey is the key a middleware stores a request's or a message's
// record under, the one formula httpmw, grpcmw, kafkamw and oncectl share:
// ScopedKey of the scope and the client's key, with gRPC's full method
// name before the key (method "" for HTTP and Kafka), placed at place
// (Placed; "" for none). Records are found again only while it stays the
// same: it never changes. The Key it returns is checked: pass it to
// idem.Guard.Do as its String (the text the store keeps).
//
//	HTTP:  StoredKey(scope, "", key, place)
//	gRPC:  StoredKey(scope, "/shop.Orders/Place", key, place)
//	Kafka: StoredKey(KafkaScope(group, topic), "", messageID, place)
func StoredKey(scope, method, key, place string) (Key, error) {
	k := scopedKey(scope, method, key)
	if place == "" {
		return Key{text: k}, nil
	}
	if err := bounds.Place(place); err != nil {
		return Key{}, err
	}
	return Key{text: "{" + place + "}" + k, place: uint8(len(place))}, nil
}

// Key is a stored key once checked: its text, 1 to lock.MaxKeyLen bytes,
// and where its place ends when it is placed ("{place}rest", see Placed).
// CheckKey, MustKey and StoredKey make one; a key travels from there to
// the store as this value, checked once and its place found once (a
// driver that shards by place reads Place, not the text). The zero Key is
// no key: every Store refuses it with ErrInvalidKey.
type Key struct {
	text  string
	place uint8 // len(place) of a placed key, 0 for an unplaced one
}

// CheckKey checks text as a stored key — 1 to lock.MaxKeyLen bytes, else
// an error matching ErrInvalidKey — and returns it as a Key, placed when
// it starts with "{place}" (PlaceOf).
func CheckKey(text string) (Key, error) {
	if err := bounds.Key(text); err != nil {
		return Key{}, err
	}
	place, _ := bounds.PlaceOf(text)
	return Key{text: text, place: uint8(len(place))}, nil
}

// MustKey is CheckKey for a key known to be valid (a constant, a test's
// key): it panics when CheckKey fails.
func MustKey(text string) Key {
	k, err := CheckKey(text)
	if err != nil {
		panic(err)
	}
	return k
}

// String returns the key's text: what the store keeps, and what
// Inspector and Lister take and report.
func (k Key) String() string { return k.text }

// IsZero reports whether k is the zero Key, which no store accepts.
func (k Key) IsZero() bool { return k.text == "" }

// Check returns nil for a Key that was made (CheckKey, MustKey,
// StoredKey), and an error matching ErrInvalidKey for the zero Key: what
// a Store's Begin starts with.
func (k Key) Check() error {
	if k.text == "" {
		return errZeroKey
	}
	return nil
}

// Place returns the place of a placed key ("" for an unplaced one).
func (k Key) Place() string {
	if k.place == 0 {
		return ""
	}
	return k.text[1 : 1+k.place]
}

// Rest returns the key's text after its "{place}" (all of it for an
// unplaced key).
func (k Key) Rest() string {
	if k.place == 0 {
		return k.text
	}
	return k.text[2+k.place:]
}

// KafkaScope is kafkamw's default scope of a message's key: its consumer
// group and its (original) topic.
func KafkaScope(group, topic string) string { return "kafka\x00" + group + "\x00" + topic }

// errZeroKey is the error of a zero Key, which every Store refuses.
var errZeroKey = fmt.Errorf("%w: the zero Key (make one with CheckKey or StoredKey)", lock.ErrInvalidKey)

// appendPart appends p to b, length-prefixed.
func appendPart[T string | []byte](b []byte, p T) []byte {
	return append(binary.BigEndian.AppendUint64(b, uint64(len(p))), p...)
}

// MaxClientKeyLen is the longest idempotency key a client may send (HTTP's
// Idempotency-Key, gRPC's idempotency-key metadata, a message ID), in
// bytes.
const MaxClientKeyLen = 255

// CheckClientKey validates a key as a client sent it, the rule every
// middleware applies before scoping it (ScopedKey): 1 to MaxClientKeyLen
// bytes of visible ASCII (0x21–0x7E).
func CheckClientKey(k string) error {
	switch {
	case k == "":
		return errors.New("the key is empty")
	case len(k) > MaxClientKeyLen:
		return fmt.Errorf("the key is longer than %d bytes", MaxClientKeyLen)
	}
	for i := 0; i < len(k); i++ {
		if c := k[i]; c < 0x21 || c > 0x7e {
			return fmt.Errorf("byte %d of the key is %q: only visible ASCII is allowed", i, c)
		}
	}
	return nil
}

// NewKey returns a fresh idempotency key for a logical operation that has
// none: a UUID of version 7 (RFC 9562: the time in milliseconds, then 74
// random bits) in its canonical 36-character form, as Google's AIP-155
// asks of a request_id, and sortable by when it was minted. Middleware
// that mints keys on a client's behalf (grpcmw's client interceptor,
// kafkamw's Producer) uses it.
func NewKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	ms := uint64(time.Now().UnixMilli())
	for i := range 6 {
		b[i] = byte(ms >> (40 - 8*i))
	}
	b[6] = b[6]&0x0f | 0x70 // version 7
	b[8] = b[8]&0x3f | 0x80 // the RFC 9562 variant
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

// PlaceOf returns the place of a key made by idem.Placed, and false for a key
// that is not placed: one that does not start with '{', one whose first
// '}' comes right after it or more than MaxPlaceLen bytes later.
func PlaceOf(key string) (place string, ok bool) { return bounds.PlaceOf(key) }

// MaxPlaceLen is the longest place of a placed key (idem.Placed), in
// bytes.
const MaxPlaceLen = bounds.MaxPlaceLen
