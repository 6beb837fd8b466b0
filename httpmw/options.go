package httpmw

import (
	"bytes"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/internal/mwcore"
)

// Defaults.
const (
	DefaultHeader      = "Idempotency-Key"
	DefaultMaxBody     = 1 << 20
	DefaultMaxResponse = 1<<20 - 64*1024 // a Guard's default result limit (1 MiB), less room for the status and headers
	// ReplayedHeader marks a replayed response.
	ReplayedHeader = "Idempotent-Replayed"
)

// DefaultReplayHeaders are the response headers stored and replayed.
var DefaultReplayHeaders = []string{
	"Content-Type", "Content-Language", "Content-Encoding", "Content-Disposition",
	"Location", "Cache-Control", "ETag",
}

// forbidden headers are never stored, even when configured: credentials,
// cookies, and hop-by-hop headers.
var forbidden = []string{
	"Set-Cookie", "Authorization", "Proxy-Authorization", "Proxy-Authenticate", "Www-Authenticate",
	"Connection", "Keep-Alive", "Te", "Trailer", "Transfer-Encoding", "Upgrade", "Content-Length",
}

// Option configures the middleware.
type Option func(*config)

type config struct {
	methods      []string
	header       string
	scope        func(*http.Request) string
	place        func(*http.Request) string
	extract      func(*http.Request) (string, bool)
	fingerprint  func(r *http.Request, body []byte) (string, error)
	route        func(*http.Request) string
	optional     bool
	maxBody      int64
	maxResponse  int
	replay       map[string]bool
	final        func(r *http.Request, status int, header http.Header) bool
	finalDefault bool          // final is DefaultFinal, set by New
	common       mwcore.Config // the key space chosen, the wait, failing open
	errs         []error
}

// WithMethods sets the methods the middleware covers. Requests with other
// methods pass through untouched, key or not. Default POST and PATCH.
func WithMethods(methods ...string) Option {
	return func(c *config) {
		c.methods = nil
		for _, m := range methods {
			if m == "" {
				c.errs = append(c.errs, errors.New("empty method"))
			}
			c.methods = append(c.methods, strings.ToUpper(m))
		}
	}
}

// WithKeyHeader sets the request header that carries the key. Default
// "Idempotency-Key".
func WithKeyHeader(name string) Option {
	return func(c *config) {
		if name == "" {
			c.errs = append(c.errs, errors.New("empty header name"))
		}
		c.header = name
	}
}

// WithScope derives a scope from each request — the authenticated
// principal, a tenant — that becomes part of the stored key, so that one
// principal can never replay another's response. Every middleware must
// choose: WithScope, or Unscoped. A scope function that returns "" for a
// request gets it refused with 500 (CodeScopeEmpty), nothing run: an empty
// scope is the key space that unscoped requests share. The function may
// read the request's
// body: the handler still gets it whole.
func WithScope(scope func(*http.Request) string) Option {
	return func(c *config) {
		if scope == nil {
			c.errs = append(c.errs, errors.New("nil scope function"))
		}
		c.scope = scope
		c.common.ChooseScope()
	}
}

// WithPlacement places each request's record (idem.Placed) where the
// handler's effect lives: on Redis Cluster, in the slot of the hash tag
// {place}, so that an effect on keys tagged {place} (a SKU's stock and
// orders) commits in the script that completes the record
// (httpmw.Commit). Other stores keep a placed record as any other. The
// function may read the request's body: the handler still gets it whole.
// "" leaves the request's record unplaced; a place over
// idemdriver.MaxPlaceLen bytes or with a brace gets the request refused with 400
// (CodeKeyInvalid), nothing run. The place is part of the stored key: keep
// it a function of the request, the same on every retry.
func WithPlacement(place func(*http.Request) string) Option {
	return func(c *config) {
		if place == nil {
			c.errs = append(c.errs, errors.New("nil placement function"))
		}
		c.place = place
	}
}

// WithFingerprint replaces what makes two requests with one key "the same
// request" (a duplicate is replayed, another request with the key is 422
// CodeKeyReused). fingerprint gets the request and its whole body (the
// handler still gets it); an error refuses the request with 400
// CodeBodyInvalid, nothing run. Default DefaultFingerprint; JSONFingerprint
// for clients that re-serialise a retry's JSON body.
func WithFingerprint(fingerprint func(r *http.Request, body []byte) (string, error)) Option {
	return func(c *config) {
		if fingerprint == nil {
			c.errs = append(c.errs, errors.New("nil fingerprint function"))
		}
		c.fingerprint = fingerprint
	}
}

// DefaultFingerprint is the request's method, its path and query as sent,
// its Content-Type and its body, byte for byte.
func DefaultFingerprint(r *http.Request, body []byte) (string, error) {
	return idem.Fingerprint([]byte(r.Method), []byte(target(r)), []byte(r.Header.Get("Content-Type")), body), nil
}

// JSONFingerprint is DefaultFingerprint for JSON APIs: the method, the
// path and query as sent, the media type without its parameters and in
// lower case ("application/json; charset=utf-8" is "application/json"),
// and the body in canonical form (idemdriver.CanonicalJSON), so that a retry
// that re-serialises its body — another member order, other whitespace —
// is the same request. An empty body stays empty; a body that is not one
// JSON value is an error (400 CodeBodyInvalid).
func JSONFingerprint(r *http.Request, body []byte) (string, error) {
	media := ""
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil {
			return "", fmt.Errorf("Content-Type %q: %w", ct, err)
		}
		media = mt // lower case
	}
	if len(bytes.TrimSpace(body)) > 0 {
		c, err := idemdriver.CanonicalJSON(body)
		if err != nil {
			return "", err
		}
		body = c
	}
	return idem.Fingerprint([]byte(r.Method), []byte(target(r)), []byte(media), body), nil
}

// target is the request's path and query as sent.
func target(r *http.Request) string {
	t := r.URL.EscapedPath()
	if r.URL.RawQuery != "" {
		t += "?" + r.URL.RawQuery
	}
	return t
}

// WithKeyExtractor takes the key from the request when it carries no key
// header: from a route parameter (chi.URLParam(r, "paymentID")) or a body
// field (an order's client-chosen "request_id"), say. extract may read the
// body (the handler still gets it whole, and it counts against
// WithMaxBody); it reports false when the request carries no key, which is
// then answered as one without the header (400 CodeKeyMissing, or passed
// through with WithOptionalKey). An extracted key obeys the header's rules
// (idemdriver.CheckClientKey: 1 to 255 bytes of visible ASCII; 400
// CodeKeyInvalid otherwise). The header wins when both are there.
func WithKeyExtractor(extract func(*http.Request) (key string, ok bool)) Option {
	return func(c *config) {
		if extract == nil {
			c.errs = append(c.errs, errors.New("nil key extractor"))
		}
		c.extract = extract
	}
}

// Unscoped puts every request's key in one key space: any client that
// knows a key gets its response replayed. Only for services without
// principals (the keys are unguessable and private to one client) or where
// a gateway scopes keys before they arrive.
func Unscoped() Option { return func(c *config) { c.common.ChooseScope() } }

// WithFinal decides which of the handler's responses are final — stored
// and replayed to every duplicate — and which are not, so that the claim
// is dropped and a retry runs the handler again. final sees the request,
// the status and the response's headers. Default DefaultFinal. A handler
// can also mark one response final itself (Final). The middleware's own
// answers (409 request_in_flight, 422, 503) are never stored.
func WithFinal(final func(r *http.Request, status int, header http.Header) bool) Option {
	return func(c *config) {
		if final == nil {
			c.errs = append(c.errs, errors.New("nil final function"))
		}
		c.final = final
	}
}

// DefaultFinal stores 2xx, 3xx and 4xx responses except 401 and 403 (a
// retry with valid credentials must run), 408, 409, 425 and 429 (conflicts
// and throttling that a retry may get past). 5xx is never final.
func DefaultFinal(_ *http.Request, status int, _ http.Header) bool {
	switch {
	case status >= 500:
		return false
	case status == http.StatusUnauthorized, status == http.StatusForbidden, status == http.StatusRequestTimeout,
		status == http.StatusConflict, status == http.StatusTooEarly, status == http.StatusTooManyRequests:
		return false
	}
	return true
}

// Final marks the response the handler is writing on w as final: stored
// and replayed, whatever its status (short of 5xx), such as a business 409
// sold_out that a retry must see again even after a restock. Call it
// before writing the response. It reports false when w is not a writer of
// this middleware (the request is not covered).
func Final(w http.ResponseWriter) bool {
	for {
		switch v := w.(type) {
		case *recorder:
			v.final = true
			return true
		case interface{ Unwrap() http.ResponseWriter }:
			w = v.Unwrap()
		default:
			return false
		}
	}
}

// WithRoute names a request's route for metrics and traces, e.g. the
// router's pattern ("POST /orders/{id}"). It must be a small, bounded set:
// it becomes a metric label. Default: r.Pattern when net/http's ServeMux
// matched one, else the method.
func WithRoute(route func(*http.Request) string) Option { return func(c *config) { c.route = route } }

// WithOptionalKey lets requests without a key through, without
// idempotency, instead of answering 400. A malformed key is still a 400.
func WithOptionalKey() Option { return func(c *config) { c.optional = true } }

// WithMaxBody sets the largest request body read for the fingerprint;
// a larger one is answered 413. Default 1 MiB.
func WithMaxBody(n int64) Option {
	return func(c *config) {
		if n < 0 {
			c.errs = append(c.errs, fmt.Errorf("negative body limit %d", n))
		}
		c.maxBody = n
	}
}

// WithMaxResponse sets the largest response body stored; a larger response
// is still sent but not stored, so a retry runs again. It should leave the
// Guard's result limit (idem.WithMaxResult) room for the status and
// headers. Default 960 KiB.
func WithMaxResponse(n int) Option {
	return func(c *config) {
		if n < 0 {
			c.errs = append(c.errs, fmt.Errorf("negative response limit %d", n))
		}
		c.maxResponse = n
	}
}

// WithWait makes a duplicate that arrives while the first request is in
// flight wait up to d for its response and replay it, instead of getting
// 409 at once. Default: the Guard's own wait (idem.WithWait), which is 0.
func WithWait(d time.Duration) Option {
	return func(c *config) { c.common.SetWait(d) }
}

// WithFailOpen runs the handler without idempotency when the store cannot
// be reached, instead of answering 503. Duplicates may then run twice:
// only for handlers where that is better than refusing.
func WithFailOpen() Option { return func(c *config) { c.common.SetFailOpen() } }

// WithReplayHeaders adds response headers to the stored and replayed ones
// (DefaultReplayHeaders). Set-Cookie, Authorization and hop-by-hop headers
// are refused.
func WithReplayHeaders(names ...string) Option {
	return func(c *config) {
		for _, n := range names {
			k := http.CanonicalHeaderKey(n)
			if n == "" || slices.Contains(forbidden, k) {
				c.errs = append(c.errs, fmt.Errorf("header %q cannot be replayed", n))
				continue
			}
			c.replay[k] = true
		}
	}
}
