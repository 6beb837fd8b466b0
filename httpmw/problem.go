package httpmw

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// Problem codes: the stable "code" member of every error response.
const (
	CodeKeyMissing     = "idempotency_key_missing"
	CodeKeyInvalid     = "idempotency_key_invalid"
	CodeKeyReused      = "idempotency_key_reused"
	CodeInFlight       = "request_in_flight"
	CodeStoreDown      = "store_unavailable"
	CodeBodyTooLarge   = "body_too_large"
	CodeBodyUnreadable = "request_body_unreadable"
	CodeRecordCorrupt  = "stored_response_corrupt"
	// CodeBodyInvalid: the fingerprint function (WithFingerprint) could
	// not read the request: a body JSONFingerprint cannot parse, say.
	CodeBodyInvalid = "request_body_invalid"
	// CodeScopeEmpty: the scope function (WithScope) returned "" for a
	// request: answered 500, nothing run, rather than letting the request
	// into the key space every unscoped request shares.
	CodeScopeEmpty    = "idempotency_scope_empty"
	CodeEffectRefused = "effect_refused"
	// CodeEffectNotCommitted: the handler committed an effect (Commit) but
	// its response could not be stored with it (over WithMaxResponse, not
	// final, a stream), or the store failed the effect: neither was
	// applied. Status 500.
	CodeEffectNotCommitted = "effect_not_committed"
	problemContentType     = "application/problem+json"
)

// Problem is the RFC 9457 body of every error response the middleware
// writes.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// Code is stable across versions: match on it, not on Detail.
	Code string `json:"code"`
}

func writeProblem(w http.ResponseWriter, status int, code, detail string, retryAfter int) {
	h := w.Header()
	h.Set("Content-Type", problemContentType)
	h.Set("Cache-Control", "no-store")
	if retryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(retryAfter))
	}
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(Problem{
		Type: "about:blank", Title: http.StatusText(status), Status: status, Detail: detail, Code: code,
	})
}
