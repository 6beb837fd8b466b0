package rediskit

import (
	"strings"

	"github.com/oncekit/oncekit/core/idem/idemdriver"
)

// Tag is key as a Cluster hash tag, the part of every name of one key
// between '{' and '}': '{', '}' and '%' are percent-escaped, so that the
// tag holds no brace (a key like "}x" would otherwise end the tag early,
// or leave it empty, and scatter one lock's names over several slots) and
// distinct keys keep distinct names. Keys without those bytes are their
// own tag.
func Tag(key string) string {
	if !strings.ContainsAny(key, "{}%") {
		return key
	}
	var b strings.Builder
	for i := range len(key) {
		switch c := key[i]; c {
		case '{':
			b.WriteString("%7B")
		case '}':
			b.WriteString("%7D")
		case '%':
			b.WriteString("%25")
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// Keys names one lock's Redis keys and channels: they share the hash tag
// {Tag(key)}, so under Cluster they live in one slot.
type Keys struct{ Prefix string }

// Lock is the name holding the holder's token and the key's last fence
// (see lua/fence.lua).
func (k Keys) Lock(key string) string { return k.Prefix + "{" + Tag(key) + "}" }

// Owner is the name of the hash recording an owner's holds (reentrancy).
func (k Keys) Owner(key string) string { return k.Prefix + "{" + Tag(key) + "}:owner" }

// Queue is the sorted set of processes waiting for key, in arrival order.
func (k Keys) Queue(key string) string { return k.Prefix + "{" + Tag(key) + "}:q" }

// QueueExpiry is the hash of the queue members' expiries.
func (k Keys) QueueExpiry(key string) string { return k.Prefix + "{" + Tag(key) + "}:qx" }

// Channel is the channel a release of key is announced on to every
// waiting process.
func (k Keys) Channel(key string) string { return k.Prefix + "{" + Tag(key) + "}:release" }

// MemberChannel is where a release of key is announced to member alone,
// when it is first in the key's waiting queue.
func (k Keys) MemberChannel(key, member string) string { return k.Channel(key) + ":" + member }

// Records names an idempotency record's Redis key and channel: they share
// the hash tag {key}, or {place} for a key placed with idem.Placed.
type Records struct{ Prefix string }

// Record is the name of key's record (see lua/claim.lua): Prefix{key},
// with key as a hash tag (Tag), or Prefix{place}:rest for a placed key
// "{place}rest" (idemdriver.Key.Place), in the slot of every name tagged
// {place}. The two forms never meet: the first ends with '}', the second
// never does (rest is escaped by Tag, so it holds no '}').
func (r Records) Record(key idemdriver.Key) string {
	if place := key.Place(); place != "" {
		return r.Prefix + "{" + place + "}:" + Tag(key.Rest())
	}
	return r.Prefix + "{" + Tag(key.String()) + "}"
}

// KeyOf returns the key whose record is named name (Record's inverse), and
// false for a name that is no record's.
func (r Records) KeyOf(name string) (string, bool) {
	rest, ok := strings.CutPrefix(name, r.Prefix)
	if !ok || !strings.HasPrefix(rest, "{") {
		return "", false
	}
	end := strings.IndexByte(rest, '}')
	var key string
	switch {
	case end < 0:
		return "", false
	case end == len(rest)-1: // {key}
		key, ok = untag(rest[1:end])
	case rest[end+1] == ':': // {place}:rest
		var tail string
		tail, ok = untag(rest[end+2:])
		key = rest[:end+1] + tail
	default:
		return "", false
	}
	if !ok {
		return "", false
	}
	if k, err := idemdriver.CheckKey(key); err != nil || r.Record(k) != name {
		return "", false
	}
	return key, true
}

// untag is Tag's inverse; false for a string Tag cannot have made.
func untag(s string) (string, bool) {
	if !strings.Contains(s, "%") {
		return s, !strings.ContainsAny(s, "{}")
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			b.WriteByte(s[i])
			continue
		}
		if i+3 > len(s) {
			return "", false
		}
		switch s[i : i+3] {
		case "%7B":
			b.WriteByte('{')
		case "%7D":
			b.WriteByte('}')
		case "%25":
			b.WriteByte('%')
		default:
			return "", false
		}
		i += 2
	}
	return b.String(), true
}

// Channel is where completion and abandonment of key are announced.
func (r Records) Channel(key idemdriver.Key) string { return recordChannel(r.Record(key)) }

// recordChannel is the completion channel of the record named rec.
func recordChannel(rec string) string { return rec + ":done" }
