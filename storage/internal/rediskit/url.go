package rediskit

import (
	"crypto/tls"
	"net/url"
	"time"
)

// Knobs are the go-redis options a URL opener sets where the URL does not.
type Knobs struct {
	Dial, Read, Write         *time.Duration
	MaxRetries, DialerRetries *int
	ContextTimeoutEnabled     *bool
}

// Tune applies timeout where the URL's query q set none, retries once (an
// unreachable server answers within the timeout, not several), and lets
// bounded calls run on the caller's goroutine.
func Tune(q url.Values, timeout time.Duration, k Knobs) {
	for name, d := range map[string]*time.Duration{"dial_timeout": k.Dial, "read_timeout": k.Read, "write_timeout": k.Write} {
		if !q.Has(name) {
			*d = timeout
		}
	}
	for name, n := range map[string]*int{"max_retries": k.MaxRetries, "dialer_retries": k.DialerRetries} {
		if !q.Has(name) {
			*n = 1
		}
	}
	if !q.Has("context_timeout_enabled") {
		*k.ContextTimeoutEnabled = true
	}
}

// WithTLS is the URL's TLS configuration (ca, cert, key) over the one
// go-redis made for a rediss scheme (keeping its server name).
func WithTLS(own, parsed *tls.Config) *tls.Config {
	if own == nil {
		return parsed
	}
	t := own.Clone()
	if parsed != nil {
		t.ServerName = parsed.ServerName
	}
	return t
}

// MultiHostForm turns "scheme://user@h1,h2,h3/db?q" (hosts given) into
// go-redis' form of several hosts, "redis://user@h1/db?q&addr=h2&addr=h3".
func MultiHostForm(u *url.URL, scheme string, hosts []string) string {
	g := *u
	g.Scheme, g.Host = scheme, hosts[0]
	q := g.Query()
	for _, h := range hosts[1:] {
		q.Add("addr", h)
	}
	g.RawQuery = q.Encode()
	return g.String()
}
