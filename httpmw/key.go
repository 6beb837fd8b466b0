package httpmw

import (
	"errors"
	"fmt"
	"strings"

	"github.com/oncekit/oncekit/core/idem/idemdriver"
)

// MaxKeyLen is the longest idempotency key accepted, in bytes: the rule
// of every oncekit middleware (idemdriver.MaxClientKeyLen).
const MaxKeyLen = idemdriver.MaxClientKeyLen

var errKeyTooLong = fmt.Errorf("the key is longer than %d bytes", MaxKeyLen)

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
	if err := idemdriver.CheckClientKey(k); err != nil {
		return "", err
	}
	return k, nil
}
