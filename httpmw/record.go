package httpmw

import (
	"encoding/binary"
	"errors"
)

// A stored response is a version byte, the status (uvarint), the number of
// header values (uvarint), each as name and value with uvarint lengths, and
// the body. Version 1 (2-byte lengths, which a value over 64 KiB wrapped)
// is no longer written or read: its records are reported corrupt.
const recordVersion = 2

type response struct {
	status int
	fields []string // the stored headers: name, value, name, value…; a name's values together
	body   []byte
}

func (r response) encode() []byte {
	n := 1 + 2*binary.MaxVarintLen32 + len(r.body)
	for _, f := range r.fields {
		n += binary.MaxVarintLen32 + len(f)
	}
	b := make([]byte, 0, n)
	b = append(b, recordVersion)
	b = binary.AppendUvarint(b, uint64(r.status))
	b = binary.AppendUvarint(b, uint64(len(r.fields)/2))
	for _, f := range r.fields[:len(r.fields)&^1] {
		b = binary.AppendUvarint(b, uint64(len(f)))
		b = append(b, f...)
	}
	return append(b, r.body...)
}

var errCorrupt = errors.New("not a stored HTTP response")

func decodeResponse(b []byte) (response, error) {
	if len(b) < 1 || b[0] != recordVersion {
		return response{}, errCorrupt
	}
	b = b[1:]
	num := func(limit uint64) (uint64, bool) {
		v, n := binary.Uvarint(b)
		if n <= 0 || v > limit {
			return 0, false
		}
		b = b[n:]
		return v, true
	}
	str := func() (string, bool) {
		n, ok := num(uint64(len(b)))
		if !ok || uint64(len(b)) < n {
			return "", false
		}
		s := string(b[:n])
		b = b[n:]
		return s, true
	}
	status, ok1 := num(999)
	count, ok2 := num(uint64(len(b)) / 2) // every value takes 2 bytes at least
	if !ok1 || !ok2 || status < 100 {
		return response{}, errCorrupt
	}
	r := response{status: int(status), fields: make([]string, 0, 2*min(count, 16))}
	for range count {
		k, ok1 := str()
		v, ok2 := str()
		if !ok1 || !ok2 {
			return response{}, errCorrupt
		}
		r.fields = append(r.fields, k, v)
	}
	r.body = b
	return r, nil
}
