package idem

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"

	"github.com/oncekit/oncekit/core/internal/bounds"
)

// Fingerprint hashes the parts of a request that make it "the same
// request" (method, route, body...) into a hex SHA-256. Parts are
// length-prefixed, so their boundaries count.
func Fingerprint(parts ...[]byte) string {
	total := 0
	for _, p := range parts {
		total += 8 + len(p)
	}
	if total <= 1024 { // (a larger body is hashed as it is, not copied)
		var stack [1024]byte
		b := stack[:0]
		for _, p := range parts {
			b = appendPart(b, p)
		}
		return hexKey("", sha256.Sum256(b))
	}
	return hexKey("", fingerprintLarge(parts))
}

// fingerprintLarge is Fingerprint's hash of parts over a kilobyte: copied
// through a buffer of its own into the digest, so that parts never reach
// an interface (they would escape, and so would every caller's
// conversion of a string into a part).
func fingerprintLarge(parts [][]byte) [sha256.Size]byte {
	h := sha256.New()
	buf := make([]byte, 4096)
	for _, p := range parts {
		h.Write(binary.BigEndian.AppendUint64(buf[:0], uint64(len(p))))
		for len(p) > 0 {
			n := copy(buf, p)
			h.Write(buf[:n])
			p = p[n:]
		}
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum
}

// appendPart appends p to b, length-prefixed.
func appendPart[T string | []byte](b []byte, p T) []byte {
	return append(binary.BigEndian.AppendUint64(b, uint64(len(p))), p...)
}

// hexKey is prefix and the hex of sum, in one allocation.
func hexKey(prefix string, sum [sha256.Size]byte) string {
	var out [16 + 2*sha256.Size]byte
	n := copy(out[:], prefix)
	hex.Encode(out[n:], sum[:])
	return string(out[:n+2*sha256.Size])
}

// Placed returns key placed in place: the stored key "{place}key". A
// driver that spreads its keys over shards keeps the record of a placed
// key in place's shard — redisstore on Redis Cluster: the slot of the
// hash tag {place}, where every Redis key named "...{place}..." lives —
// so that an effect on the caller's keys tagged {place} commits in the
// script that completes the record (redisstore.Effect). Other drivers
// store a placed key as any other.
//
// place is 1 to 64 bytes without '{' or '}'; an empty place
// returns key unplaced. Middleware places stored keys with their
// WithPlacement options.
func Placed(place, key string) (string, error) {
	if place == "" {
		return key, nil
	}
	if err := bounds.Place(place); err != nil {
		return "", err
	}
	return "{" + place + "}" + key, nil
}
