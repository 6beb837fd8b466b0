package httpmw_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-retryablehttp"

	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/httpmw"
	"github.com/oncekit/oncekit/storage/memstore"
)

// lossyServer serves an idempotent handler whose first response is lost on
// the way back (the handler ran; the client sees 502, as behind a proxy
// that dropped the connection), and records the key of every attempt.
type lossyServer struct {
	runs  atomic.Int64
	mu    sync.Mutex
	keys  []string
	calls int
}

func newLossyServer(t *testing.T) (*lossyServer, string) {
	s := &lossyServer{}
	h := newMW(t, memstore.New(), nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.runs.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.keys = append(s.keys, r.Header.Get(httpmw.DefaultHeader))
		s.calls++
		first := s.calls == 1
		s.mu.Unlock()
		if first {
			h.ServeHTTP(httptest.NewRecorder(), r) // ran, answer lost
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return s, srv.URL
}

func retrying() *retryablehttp.Client {
	rc := retryablehttp.NewClient()
	rc.RetryWaitMin, rc.RetryWaitMax, rc.RetryMax = time.Millisecond, 5*time.Millisecond, 3
	rc.Logger = nil
	return rc
}

// The Transport outside a retrying transport: the attempts of one logical
// request carry one key, so the handler runs once and the retry gets its
// answer replayed. Inside the retry loop (the wrong order) each attempt
// gets a key of its own and the handler runs twice.
func TestTransportKeepsKeyAcrossRetries(t *testing.T) {
	t.Run("outside the retries", func(t *testing.T) {
		s, url := newLossyServer(t)
		client := &http.Client{Transport: &httpmw.Transport{Base: &retryablehttp.RoundTripper{Client: retrying()}}}
		resp, err := client.Post(url, "application/json", strings.NewReader(`{"sku":"tv-1"}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated || resp.Header.Get(httpmw.ReplayedHeader) != "true" || s.runs.Load() != 1 {
			t.Errorf("%d %v, %d runs; want the first run's answer replayed", resp.StatusCode, resp.Header, s.runs.Load())
		}
		if len(s.keys) != 2 || s.keys[0] == "" || s.keys[0] != s.keys[1] {
			t.Errorf("keys of the attempts %q, want one key twice", s.keys)
		}
	})
	t.Run("inside the retries", func(t *testing.T) {
		s, url := newLossyServer(t)
		rc := retrying()
		rc.HTTPClient.Transport = &httpmw.Transport{}
		resp, err := rc.Post(url, "application/json", []byte(`{"sku":"tv-1"}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if s.runs.Load() != 2 || len(s.keys) != 2 || s.keys[0] == s.keys[1] {
			t.Errorf("%d runs, keys %q; the wrong order was expected to run twice under two keys", s.runs.Load(), s.keys)
		}
	})
}

// A key in the context (ContextWithKey) or already on the request is
// sent as it is; other methods get none; the request is never changed.
func TestTransportKeys(t *testing.T) {
	var got []string
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		got = append(got, r.Method+" "+r.Header.Get(httpmw.DefaultHeader))
		return &http.Response{StatusCode: 200, Body: io.NopCloser(strings.NewReader("")), Request: r}, nil
	})
	tr := &httpmw.Transport{Base: base, NewKey: func() string { return "minted" }}
	send := func(ctx context.Context, method, header string) *http.Request {
		req, _ := http.NewRequestWithContext(ctx, method, "http://x/orders", nil)
		if header != "" {
			req.Header.Set(httpmw.DefaultHeader, header)
		}
		if _, err := tr.RoundTrip(req); err != nil {
			t.Fatal(err)
		}
		return req
	}
	orig := send(context.Background(), "POST", "")
	send(httpmw.ContextWithKey(context.Background(), "job-42"), "POST", "")
	send(context.Background(), "PATCH", "own")
	send(context.Background(), "GET", "")
	want := []string{"POST minted", "POST job-42", "PATCH own", "GET "}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("sent %q, want %q", got, want)
	}
	if orig.Header.Get(httpmw.DefaultHeader) != "" {
		t.Error("the caller's request was changed")
	}
	if k := idemdriver.NewKey(); len(k) != 36 {
		t.Errorf("default key %q", k)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
