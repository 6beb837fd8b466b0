package httpmw

import (
	"errors"
	"fmt"
	"strings"
)

// MaxKeyLen is the longest idempotency key accepted, in bytes.
const MaxKeyLen = 255

var (
	errKeyEmpty   = errors.New("the key is empty")
	errKeyTooLong = fmt.Errorf("the key is longer than %d bytes", MaxKeyLen)
)

// ParseKey reads an Idempotency-Key header value. The IETF draft makes it
// a structured-field string ("abc"); the bare form (abc) is accepted too
// and means the same key. A key is 1 to MaxKeyLen bytes of visible ASCII
// (0x21–0x7E); a quoted key may escape '"' and '\' with '\'. Parameters
// after the string, spaces, control and non-ASCII characters are errors.
func ParseKey(v string) (string, error) {
	if strings.HasPrefix(v, `"`) {
		var b strings.Builder
		for i := 1; i < len(v); i++ {
			switch c := v[i]; {
			case c == '\\':
				i++
				if i == len(v) || (v[i] != '"' && v[i] != '\\') {
					return "", errors.New(`a quoted key may only escape '"' and '\'`)
				}
				b.WriteByte(v[i])
			case c == '"':
				if i != len(v)-1 {
					return "", errors.New("unexpected characters after the quoted key")
				}
				return checkKey(b.String())
			default:
				b.WriteByte(c)
			}
			if b.Len() > MaxKeyLen {
				return "", errKeyTooLong
			}
		}
		return "", errors.New("the quoted key is not closed")
	}
	return checkKey(v)
}

func checkKey(k string) (string, error) {
	switch {
	case k == "":
		return "", errKeyEmpty
	case len(k) > MaxKeyLen:
		return "", errKeyTooLong
	}
	for i := 0; i < len(k); i++ {
		if c := k[i]; c < 0x21 || c > 0x7e {
			return "", fmt.Errorf("byte %d of the key is %q: only visible ASCII is allowed", i, c)
		}
	}
	return k, nil
}
