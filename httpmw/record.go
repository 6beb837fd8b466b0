package httpmw

import (
	"encoding/binary"
	"errors"
	"net/http"
)

// A stored response is a version byte, the status (2 bytes), the number
// of header values (2 bytes), each as name and value with 2-byte lengths,
// and the body.
const recordVersion = 1

type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) encode() []byte {
	n := 5 + len(r.body)
	count := 0
	for k, vs := range r.header {
		for _, v := range vs {
			n += 4 + len(k) + len(v)
			count++
		}
	}
	b := make([]byte, 0, n)
	b = append(b, recordVersion)
	b = binary.BigEndian.AppendUint16(b, uint16(r.status))
	b = binary.BigEndian.AppendUint16(b, uint16(count))
	for k, vs := range r.header {
		for _, v := range vs {
			b = binary.BigEndian.AppendUint16(b, uint16(len(k)))
			b = append(b, k...)
			b = binary.BigEndian.AppendUint16(b, uint16(len(v)))
			b = append(b, v...)
		}
	}
	return append(b, r.body...)
}

var errCorrupt = errors.New("not a stored HTTP response")

func decodeResponse(b []byte) (response, error) {
	if len(b) < 5 || b[0] != recordVersion {
		return response{}, errCorrupt
	}
	r := response{status: int(binary.BigEndian.Uint16(b[1:3])), header: http.Header{}}
	if r.status < 100 || r.status > 999 {
		return response{}, errCorrupt
	}
	count := int(binary.BigEndian.Uint16(b[3:5]))
	b = b[5:]
	str := func() (string, bool) {
		if len(b) < 2 {
			return "", false
		}
		n := int(binary.BigEndian.Uint16(b))
		if len(b) < 2+n {
			return "", false
		}
		s := string(b[2 : 2+n])
		b = b[2+n:]
		return s, true
	}
	for range count {
		k, ok1 := str()
		v, ok2 := str()
		if !ok1 || !ok2 {
			return response{}, errCorrupt
		}
		r.header[k] = append(r.header[k], v)
	}
	r.body = b
	return r, nil
}
