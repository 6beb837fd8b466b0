package token

import (
	"crypto/rand"
	"encoding/base64"
)

// New returns 128 random bits, URL-safe base64 encoded (22 bytes).
func New() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return base64.RawURLEncoding.EncodeToString(b[:])
}
