package httpmw

import (
	"context"
	"net/http"
	"slices"

	"github.com/oncekit/oncekit/core/idem/idemdriver"
)

// Transport is the client side of the middleware: an http.RoundTripper
// that gives each request of a covered method one idempotency key, in the
// key header, before it sends it through Base.
//
// Place it outside the retries, so that every attempt of one logical
// request carries one key: make the retrying transport its Base (for
// go-retryablehttp, &retryablehttp.RoundTripper{Client: rc}), not the
// other way round. A Transport inside a retry loop sees each attempt as a
// new request and gives each a new key, and the server runs each once.
//
// The key is, in order: the one in the request's context
// (ContextWithKey: a key the application keeps for a logical operation —
// across its own retry loop, or persisted with a job — must be reused),
// the one the request already carries, or a new one (idemdriver.NewKey: a
// version 7 UUID). The request is cloned, never changed.
type Transport struct {
	// Base sends the requests (nil: http.DefaultTransport).
	Base http.RoundTripper
	// Header carries the key (default DefaultHeader).
	Header string
	// Methods are the methods given a key (default POST and PATCH, as
	// the middleware's default). Others are sent as they are.
	Methods []string
	// NewKey mints a key (default idemdriver.NewKey).
	NewKey func() string
}

type clientKey struct{}

// ContextWithKey returns ctx carrying key: a Transport sends it with
// every request made with the returned context, instead of minting one.
func ContextWithKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, clientKey{}, key)
}

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(r *http.Request) (*http.Response, error) {
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	methods := t.Methods
	if methods == nil {
		methods = []string{http.MethodPost, http.MethodPatch}
	}
	if !slices.Contains(methods, r.Method) {
		return base.RoundTrip(r)
	}
	header := t.Header
	if header == "" {
		header = DefaultHeader
	}
	key, fixed := r.Context().Value(clientKey{}).(string)
	if !fixed || key == "" {
		if r.Header.Get(header) != "" {
			return base.RoundTrip(r)
		}
		if t.NewKey != nil {
			key = t.NewKey()
		} else {
			key = idemdriver.NewKey()
		}
	}
	r2 := r.Clone(r.Context())
	r2.Header.Set(header, key)
	return base.RoundTrip(r2)
}
