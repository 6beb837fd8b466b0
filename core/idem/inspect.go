package idem

import (
	"errors"

	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/internal/idemerr"
)

// RecordOutcome decodes a completed record a Guard stored, as an
// Inspector reports it: the result, or the
// final error a duplicate would get (its message is all that was stored). It fails with
// ErrCorruptRecord when the bytes are not a Guard's.
func RecordOutcome(r idemdriver.RecordInfo) (result []byte, final error, err error) {
	res, err := decodeOutcome(r.Key, r.Stored)
	var re *idemerr.Replayed
	if errors.As(err, &re) {
		return nil, re, nil
	}
	return res, nil, err
}
