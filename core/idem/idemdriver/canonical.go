package idemdriver

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// CanonicalJSON returns the JSON document b in one canonical form: object
// members sorted by name, no insignificant whitespace, strings re-escaped
// the one way encoding/json writes them. Two serialisations of one value —
// another member order, other whitespace or indentation, "\u0041" for "A"
// — give the same bytes, so a fingerprint over them (Fingerprint) treats a
// client that re-serialises its retry as sending the same request.
//
// Numbers keep their text: 1, 1.0 and 1e0 stay distinct (they are distinct
// to many decoders). An object with a repeated member name is refused
// (which one counts differs between decoders), as is anything that is not
// exactly one JSON value.
func CanonicalJSON(b []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	v, err := canonicalValue(dec)
	if err != nil {
		return nil, fmt.Errorf("idem: not canonicalisable JSON: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("idem: not canonicalisable JSON: more than one value")
	}
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, fmt.Errorf("idem: not canonicalisable JSON: %w", err)
	}
	return bytes.TrimSuffix(out.Bytes(), []byte("\n")), nil
}

// canonicalValue reads one value from dec token by token, refusing
// repeated member names (which json.Unmarshal would silently merge).
// Objects become maps, whose members encoding/json writes sorted.
func canonicalValue(dec *json.Decoder) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			obj := map[string]any{}
			for dec.More() {
				nt, err := dec.Token()
				if err != nil {
					return nil, err
				}
				name, _ := nt.(string)
				if _, dup := obj[name]; dup {
					return nil, fmt.Errorf("member %q repeated", name)
				}
				if obj[name], err = canonicalValue(dec); err != nil {
					return nil, err
				}
			}
			_, err := dec.Token() // '}'
			return obj, err
		case '[':
			arr := []any{}
			for dec.More() {
				v, err := canonicalValue(dec)
				if err != nil {
					return nil, err
				}
				arr = append(arr, v)
			}
			_, err := dec.Token() // ']'
			return arr, err
		}
		return nil, fmt.Errorf("unexpected %v", t)
	default:
		return t, nil // string, json.Number, bool or nil
	}
}
