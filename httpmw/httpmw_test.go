package httpmw_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/redis/go-redis/v9"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/idem/idemtest"
	"github.com/oncekit/oncekit/core/observe"
	"github.com/oncekit/oncekit/httpmw"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/storage/memstore"
	"github.com/oncekit/oncekit/storage/redisstore"
)

// stores are the drivers every rule is checked on.
var stores = []struct {
	name string
	new  func(t *testing.T) idemdriver.Store
}{
	{"memory", func(*testing.T) idemdriver.Store { return memstore.New() }},
	{"redis", func(t *testing.T) idemdriver.Store {
		c := redis.NewClient(&redis.Options{Addr: testenv.RedisAddrs(t, 1)[0]})
		t.Cleanup(func() { _ = c.Close() })
		s, err := redisstore.New(c, redisstore.WithRecordPrefix(fmt.Sprintf("httpmw-test:%d:", time.Now().UnixNano())))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}},
}

func eachStore(t *testing.T, f func(t *testing.T, st idemdriver.Store)) {
	for _, s := range stores {
		t.Run(s.name, func(t *testing.T) { f(t, s.new(t)) })
	}
}

func newMW(t *testing.T, st idemdriver.Store, gopts []idem.Option, opts ...httpmw.Option) func(http.Handler) http.Handler {
	t.Helper()
	g, err := idem.NewGuard(st, gopts...)
	if err != nil {
		t.Fatal(err)
	}
	mw, err := httpmw.New(g, append([]httpmw.Option{httpmw.Unscoped()}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return mw
}

func newScopedMW(t *testing.T, st idemdriver.Store, scope func(*http.Request) string, opts ...httpmw.Option) func(http.Handler) http.Handler {
	t.Helper()
	g, err := idem.NewGuard(st)
	if err != nil {
		t.Fatal(err)
	}
	mw, err := httpmw.New(g, append([]httpmw.Option{httpmw.WithScope(scope)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return mw
}

// app is a chi router with handlers that count their runs.
type app struct {
	runs   atomic.Int64
	router chi.Router
}

func newApp(mw func(http.Handler) http.Handler) *app {
	a := &app{router: chi.NewRouter()}
	a.router.Use(mw)
	// POST /orders echoes the body, with a status from ?status=.
	a.router.Post("/orders", func(w http.ResponseWriter, r *http.Request) {
		n := a.runs.Add(1)
		body, _ := io.ReadAll(r.Body)
		status := http.StatusCreated
		if s := r.URL.Query().Get("status"); s != "" {
			fmt.Sscan(s, &status)
		}
		h := w.Header()
		h.Set("Content-Type", "application/json")
		h.Set("Location", "/orders/42")
		h.Set("ETag", `"v1"`)
		h.Set("X-Run", fmt.Sprint(n))
		h.Set("X-Custom", "kept")
		h.Add("X-Custom", "also kept")
		h.Set("Set-Cookie", "session=secret")
		w.WriteHeader(status)
		fmt.Fprintf(w, `{"run":%d,"body":%q}`, n, body)
	})
	a.router.Patch("/orders", func(w http.ResponseWriter, r *http.Request) {
		a.runs.Add(1)
		w.WriteHeader(http.StatusNoContent)
	})
	a.router.Get("/orders", func(w http.ResponseWriter, r *http.Request) {
		a.runs.Add(1)
		fmt.Fprint(w, "list")
	})
	return a
}

func (a *app) do(t *testing.T, method, target, key, body string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(method, target, strings.NewReader(body))
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	w := httptest.NewRecorder()
	a.router.ServeHTTP(w, req)
	return w
}

func problemCode(t *testing.T, w *httptest.ResponseRecorder) string {
	t.Helper()
	if ct := w.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("error response Content-Type %q", ct)
	}
	var p httpmw.Problem
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
		t.Fatalf("error body %q: %v", w.Body, err)
	}
	if p.Status != w.Code || p.Title == "" || p.Type == "" {
		t.Errorf("problem %+v for status %d", p, w.Code)
	}
	return p.Code
}

func TestReplayByteForByte(t *testing.T) {
	eachStore(t, func(t *testing.T, st idemdriver.Store) {
		a := newApp(newMW(t, st, nil, httpmw.WithReplayHeaders("X-Custom")))
		first := a.do(t, "POST", "/orders?sku=1", "k-1", `{"qty":1}`)
		if first.Code != http.StatusCreated || first.Header().Get(httpmw.ReplayedHeader) != "" {
			t.Fatalf("first: %d %v", first.Code, first.Header())
		}
		for _, key := range []string{"k-1", `"k-1"`} { // the quoted form is the same key
			again := a.do(t, "POST", "/orders?sku=1", key, `{"qty":1}`)
			if again.Code != first.Code || !bytes.Equal(again.Body.Bytes(), first.Body.Bytes()) {
				t.Errorf("replay %d %q, want %d %q", again.Code, again.Body, first.Code, first.Body)
			}
			h := again.Header()
			if h.Get(httpmw.ReplayedHeader) != "true" || h.Get("Content-Type") != "application/json" ||
				h.Get("Location") != "/orders/42" || h.Get("ETag") != `"v1"` || !slices.Equal(h.Values("X-Custom"), []string{"kept", "also kept"}) {
				t.Errorf("replayed headers %v", h)
			}
			if h.Get("Set-Cookie") != "" || h.Get("X-Run") != "" {
				t.Errorf("replayed a header that is not allowed: %v", h)
			}
		}
		if n := a.runs.Load(); n != 1 {
			t.Errorf("handler ran %d times", n)
		}
	})
}

func TestMethods(t *testing.T) {
	eachStore(t, func(t *testing.T, st idemdriver.Store) {
		a := newApp(newMW(t, st, nil))
		for range 2 {
			if w := a.do(t, "GET", "/orders", "k-get", ""); w.Code != 200 || w.Header().Get(httpmw.ReplayedHeader) != "" {
				t.Errorf("GET: %d %v", w.Code, w.Header())
			}
		}
		if a.runs.Load() != 2 {
			t.Errorf("GET with a key ran %d times, want 2 (passed through)", a.runs.Load())
		}
		if w := a.do(t, "PATCH", "/orders", "k-patch", ""); w.Code != 204 {
			t.Errorf("PATCH: %d", w.Code)
		}
		if w := a.do(t, "PATCH", "/orders", "k-patch", ""); w.Code != 204 || w.Header().Get(httpmw.ReplayedHeader) != "true" {
			t.Errorf("PATCH replay: %d %v", w.Code, w.Header())
		}
		b := newApp(newMW(t, st, nil, httpmw.WithMethods("PATCH")))
		b.do(t, "POST", "/orders", "k-post", "")
		b.do(t, "POST", "/orders", "k-post", "")
		if b.runs.Load() != 2 {
			t.Errorf("POST not covered ran %d times, want 2", b.runs.Load())
		}
	})
}

func TestKeyRequiredAndValid(t *testing.T) {
	a := newApp(newMW(t, memstore.New(), nil))
	if w := a.do(t, "POST", "/orders", "", "x"); w.Code != 400 || problemCode(t, w) != httpmw.CodeKeyMissing {
		t.Errorf("missing key: %d %s", w.Code, w.Body)
	}
	for _, bad := range []string{
		" ", strings.Repeat("k", 256), "a\x01b", "a b", "caf\xc3\xa9", `"unterminated`, `"a"; p=1`, `""`, `"a\nb"`, `"a\x"`,
	} {
		req := httptest.NewRequest("POST", "/orders", strings.NewReader("x"))
		req.Header["Idempotency-Key"] = []string{bad}
		w := httptest.NewRecorder()
		a.router.ServeHTTP(w, req)
		if w.Code != 400 || problemCode(t, w) != httpmw.CodeKeyInvalid {
			t.Errorf("key %q: %d %s", bad, w.Code, w.Body)
		}
	}
	req := httptest.NewRequest("POST", "/orders", nil)
	req.Header.Add("Idempotency-Key", "a")
	req.Header.Add("Idempotency-Key", "b")
	w := httptest.NewRecorder()
	a.router.ServeHTTP(w, req)
	if w.Code != 400 || problemCode(t, w) != httpmw.CodeKeyInvalid {
		t.Errorf("two keys: %d %s", w.Code, w.Body)
	}
	if a.runs.Load() != 0 {
		t.Errorf("the handler ran %d times for rejected requests", a.runs.Load())
	}
	if w := a.do(t, "POST", "/orders", strings.Repeat("k", 255), "x"); w.Code != 201 {
		t.Errorf("255-byte key: %d", w.Code)
	}

	opt := newApp(newMW(t, memstore.New(), nil, httpmw.WithOptionalKey(), httpmw.WithKeyHeader("X-Request-Id")))
	if w := opt.do(t, "POST", "/orders", "", "x"); w.Code != 201 {
		t.Errorf("optional key, none sent: %d", w.Code)
	}
	req = httptest.NewRequest("POST", "/orders", nil)
	req.Header.Set("X-Request-Id", "a b")
	w = httptest.NewRecorder()
	opt.router.ServeHTTP(w, req)
	if w.Code != 400 {
		t.Errorf("optional key, malformed: %d", w.Code)
	}
}

func TestFingerprint(t *testing.T) {
	eachStore(t, func(t *testing.T, st idemdriver.Store) {
		a := newApp(newMW(t, st, nil))
		if w := a.do(t, "POST", "/orders?x=1", "fp", "body-1"); w.Code != 201 || !strings.Contains(w.Body.String(), `"body":"body-1"`) {
			t.Fatalf("first: %d %s (the handler must get the body intact)", w.Code, w.Body)
		}
		for _, c := range []struct{ target, body string }{
			{"/orders?x=1", "body-2"}, {"/orders?x=2", "body-1"}, {"/orders", "body-1"},
		} {
			if w := a.do(t, "POST", c.target, "fp", c.body); w.Code != 422 || problemCode(t, w) != httpmw.CodeKeyReused {
				t.Errorf("%s %q: %d %s", c.target, c.body, w.Code, w.Body)
			}
		}
		if a.runs.Load() != 1 {
			t.Errorf("ran %d times", a.runs.Load())
		}
	})
}

func TestBodyLimit(t *testing.T) {
	a := newApp(newMW(t, memstore.New(), nil, httpmw.WithMaxBody(8)))
	if w := a.do(t, "POST", "/orders", "big", "123456789"); w.Code != 413 || problemCode(t, w) != httpmw.CodeBodyTooLarge {
		t.Errorf("over the limit: %d %s", w.Code, w.Body)
	}
	// Without a Content-Length the limit holds too.
	req := httptest.NewRequest("POST", "/orders", io.MultiReader(strings.NewReader("12345"), strings.NewReader("6789")))
	req.ContentLength = -1
	req.Header.Set("Idempotency-Key", "big-2")
	w := httptest.NewRecorder()
	a.router.ServeHTTP(w, req)
	if w.Code != 413 {
		t.Errorf("streamed body over the limit: %d", w.Code)
	}
	if w := a.do(t, "POST", "/orders", "small", "12345678"); w.Code != 201 {
		t.Errorf("at the limit: %d", w.Code)
	}
	if a.runs.Load() != 1 {
		t.Errorf("ran %d times", a.runs.Load())
	}
}

func TestWhatIsStored(t *testing.T) {
	eachStore(t, func(t *testing.T, st idemdriver.Store) {
		a := newApp(newMW(t, st, nil))
		for _, c := range []struct {
			status int
			stored bool
		}{
			{200, true}, {201, true}, {302, true}, {400, true}, {404, true}, {422, true},
			{401, false}, {403, false}, {408, false}, {409, false}, {425, false}, {429, false}, {500, false}, {503, false},
		} {
			key := fmt.Sprintf("status-%d", c.status)
			target := fmt.Sprintf("/orders?status=%d", c.status)
			before := a.runs.Load()
			if w := a.do(t, "POST", target, key, ""); w.Code != c.status {
				t.Fatalf("status %d answered %d", c.status, w.Code)
			}
			w := a.do(t, "POST", target, key, "")
			ran := a.runs.Load() - before
			if c.stored && (ran != 1 || w.Header().Get(httpmw.ReplayedHeader) != "true") {
				t.Errorf("status %d: ran %d times, replayed %q; want stored", c.status, ran, w.Header().Get(httpmw.ReplayedHeader))
			}
			if !c.stored && (ran != 2 || w.Header().Get(httpmw.ReplayedHeader) != "") {
				t.Errorf("status %d: ran %d times; want not stored (the retry runs)", c.status, ran)
			}
		}
	})
}

func TestPanicAbandons(t *testing.T) {
	eachStore(t, func(t *testing.T, st idemdriver.Store) {
		var runs atomic.Int64
		h := newMW(t, st, nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if runs.Add(1) == 1 {
				panic("boom")
			}
			w.WriteHeader(201)
		}))
		serve := func() (code int, panicked any) {
			defer func() { panicked = recover() }()
			req := httptest.NewRequest("POST", "/x", nil)
			req.Header.Set("Idempotency-Key", "p")
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			return w.Code, nil
		}
		if _, p := serve(); p != "boom" {
			t.Errorf("panic not passed on: %v", p)
		}
		if code, p := serve(); p != nil || code != 201 || runs.Load() != 2 {
			t.Errorf("retry after a panic: %d %v, %d runs", code, p, runs.Load())
		}
	})
}

func TestStreamsAndHijacksNotStored(t *testing.T) {
	var runs atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("POST /stream", func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		fmt.Fprint(w, "part 1")
		if err := http.NewResponseController(w).Flush(); err != nil {
			t.Error(err)
		}
		fmt.Fprint(w, "part 2")
	})
	mux.HandleFunc("POST /hijack", func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close()
		buf.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi")
		buf.Flush()
	})
	// The client has the whole response before the middleware has dropped
	// the claim: the retry waits for that.
	srv := httptest.NewServer(newMW(t, memstore.New(), nil, httpmw.WithWait(5*time.Second))(mux))
	defer srv.Close()
	for _, path := range []string{"/stream", "/hijack"} {
		before := runs.Load()
		for range 2 {
			req, _ := http.NewRequest("POST", srv.URL+path, nil)
			req.Header.Set("Idempotency-Key", "s"+path)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || resp.Header.Get(httpmw.ReplayedHeader) != "" || len(body) == 0 {
				t.Errorf("%s: %d %q %v", path, resp.StatusCode, body, resp.Header)
			}
		}
		if ran := runs.Load() - before; ran != 2 {
			t.Errorf("%s ran %d times, want 2 (not stored)", path, ran)
		}
	}
}

func TestInFlight(t *testing.T) {
	eachStore(t, func(t *testing.T, st idemdriver.Store) {
		for _, wait := range []bool{false, true} {
			started, finish := make(chan struct{}), make(chan struct{})
			var runs atomic.Int64
			var opts []httpmw.Option
			if wait {
				opts = append(opts, httpmw.WithWait(10*time.Second))
			}
			h := newMW(t, st, []idem.Option{idem.WithTTL(3 * time.Second)}, opts...)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				close(started)
				<-finish
				w.WriteHeader(201)
				fmt.Fprint(w, "made")
			}))
			key := fmt.Sprintf("slow-%v", wait)
			send := func() *httptest.ResponseRecorder {
				req := httptest.NewRequest("POST", "/x", nil)
				req.Header.Set("Idempotency-Key", key)
				w := httptest.NewRecorder()
				h.ServeHTTP(w, req)
				return w
			}
			go send()
			select {
			case <-started:
			case <-time.After(10 * time.Second):
				close(finish)
				t.Fatal("the first request never reached the handler")
			}
			if !wait {
				w := send()
				if w.Code != 409 || problemCode(t, w) != httpmw.CodeInFlight {
					t.Errorf("duplicate in flight: %d %s", w.Code, w.Body)
				}
				if ra := w.Header().Get("Retry-After"); ra != "3" && ra != "2" {
					t.Errorf("Retry-After %q, want the seconds left of a 3 s lease", ra)
				}
				close(finish)
				continue
			}
			time.AfterFunc(50*time.Millisecond, func() { close(finish) })
			w := send()
			if w.Code != 201 || w.Body.String() != "made" || w.Header().Get(httpmw.ReplayedHeader) != "true" || runs.Load() != 1 {
				t.Errorf("waiting duplicate: %d %q %v, %d runs", w.Code, w.Body, w.Header(), runs.Load())
			}
		}
	})
}

// 50 duplicates at once with one key through a chi router: the handler runs
// once, and every response is its bytes or a 409.
func TestFiftyConcurrentDuplicates(t *testing.T) {
	eachStore(t, func(t *testing.T, st idemdriver.Store) {
		for _, wait := range []bool{false, true} {
			var opts []httpmw.Option
			if wait {
				opts = append(opts, httpmw.WithWait(10*time.Second))
			}
			a := newApp(newMW(t, st, nil, opts...))
			key := fmt.Sprintf("fifty-%v", wait)
			var (
				wg        sync.WaitGroup
				mu        sync.Mutex
				bodies    = map[string]int{}
				conflicts int
			)
			start := make(chan struct{})
			for range 50 {
				wg.Go(func() {
					<-start
					w := a.do(t, "POST", "/orders", key, `{"qty":1}`)
					mu.Lock()
					defer mu.Unlock()
					switch w.Code {
					case 201:
						bodies[w.Body.String()]++
					case 409:
						conflicts++
					default:
						t.Errorf("status %d: %s", w.Code, w.Body)
					}
				})
			}
			close(start)
			wg.Wait()
			if a.runs.Load() != 1 || len(bodies) != 1 {
				t.Errorf("wait=%v: handler ran %d times; distinct bodies %v", wait, a.runs.Load(), bodies)
			}
			if wait && conflicts != 0 {
				t.Errorf("waiting duplicates got %d conflicts", conflicts)
			}
		}
	})
}

func TestScopeSeparatesPrincipals(t *testing.T) {
	eachStore(t, func(t *testing.T, st idemdriver.Store) {
		a := newApp(newScopedMW(t, st, func(r *http.Request) string { return r.Header.Get("X-User") }))
		send := func(user string) *httptest.ResponseRecorder {
			req := httptest.NewRequest("POST", "/orders", strings.NewReader("same"))
			req.Header.Set("Idempotency-Key", "shared")
			req.Header.Set("X-User", user)
			w := httptest.NewRecorder()
			a.router.ServeHTTP(w, req)
			return w
		}
		alice, bob := send("alice"), send("bob")
		if alice.Code != 201 || bob.Code != 201 || bob.Header().Get(httpmw.ReplayedHeader) != "" || a.runs.Load() != 2 {
			t.Errorf("bob replayed alice's response: %v, %d runs", bob.Header(), a.runs.Load())
		}
		if again := send("alice"); again.Header().Get(httpmw.ReplayedHeader) != "true" || again.Body.String() != alice.Body.String() {
			t.Errorf("alice's own duplicate: %v %q", again.Header(), again.Body)
		}
	})
}

// A scope function that cannot name the principal (it returns "") gets the
// request refused with 500 and nothing run: an empty scope is the key
// space that every unscoped request shares, where one user's key would
// replay to another.
func TestEmptyScopeRefused(t *testing.T) {
	eachStore(t, func(t *testing.T, st idemdriver.Store) {
		a := newApp(newScopedMW(t, st, func(r *http.Request) string { return r.Header.Get("X-User") }))
		w := a.do(t, "POST", "/orders", "k-anon", "x")
		if w.Code != http.StatusInternalServerError || problemCode(t, w) != httpmw.CodeScopeEmpty || a.runs.Load() != 0 {
			t.Errorf("a request with an empty scope: %d %s, %d runs; want 500 %s and none",
				w.Code, problemCode(t, w), a.runs.Load(), httpmw.CodeScopeEmpty)
		}
	})
}

func TestFenceInHandler(t *testing.T) {
	eachStore(t, func(t *testing.T, st idemdriver.Store) {
		var fences []uint64
		h := newMW(t, st, nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			f, ok := httpmw.Fence(r.Context())
			if !ok {
				t.Error("no fence in the handler's context")
			}
			fences = append(fences, f)
			if len(fences) == 1 {
				w.WriteHeader(http.StatusServiceUnavailable) // not stored: the retry runs
			}
		}))
		for range 2 {
			req := httptest.NewRequest("POST", "/x", nil)
			req.Header.Set("Idempotency-Key", "fenced")
			h.ServeHTTP(httptest.NewRecorder(), req)
		}
		if len(fences) != 2 || fences[0] == 0 || fences[1] <= fences[0] {
			t.Errorf("fences %v: want the retry's above the first run's", fences)
		}
	})
}

// A retry of a request whose run failed (a 5xx is not stored) knows it is
// one: idem.AttemptFrom says 2.
func TestAttemptInHandler(t *testing.T) {
	eachStore(t, func(t *testing.T, st idemdriver.Store) {
		var attempts []int
		h := newMW(t, st, nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n, ok := idem.AttemptFrom(r.Context())
			if !ok {
				t.Error("no attempt in the handler's context")
			}
			attempts = append(attempts, n)
			if len(attempts) == 1 {
				w.WriteHeader(http.StatusBadGateway) // the payment provider timed out: not stored
			}
		}))
		for range 3 {
			req := httptest.NewRequest("POST", "/x", nil)
			req.Header.Set("Idempotency-Key", "attempted")
			h.ServeHTTP(httptest.NewRecorder(), req)
		}
		if !slices.Equal(attempts, []int{1, 2}) {
			t.Errorf("the handler saw attempts %v, want [1 2] (the third request replays)", attempts)
		}
	})
}

// A store that cannot be reached: 503 and nothing run, or with FailOpen
// the handler runs.
func TestStoreUnavailable(t *testing.T) {
	testenv.QuietRedisDialErrors()
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { _ = c.Close() })
	down, err := redisstore.New(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = down.Close() })
	closed := newApp(newMW(t, down, nil))
	w := closed.do(t, "POST", "/orders", "k", "x")
	if w.Code != 503 || problemCode(t, w) != httpmw.CodeStoreDown || w.Header().Get("Retry-After") == "" || closed.runs.Load() != 0 {
		t.Errorf("fail closed: %d %s, %d runs", w.Code, w.Body, closed.runs.Load())
	}
	open := newApp(newMW(t, down, nil, httpmw.WithFailOpen()))
	if w := open.do(t, "POST", "/orders", "k", "x"); w.Code != 201 || open.runs.Load() != 1 {
		t.Errorf("fail open: %d, %d runs", w.Code, open.runs.Load())
	}
}

// A stored record that is not an HTTP response is an error, never absent.
func TestCorruptStoredResponse(t *testing.T) {
	st := memstore.New()
	g, err := idem.NewGuard(st)
	if err != nil {
		t.Fatal(err)
	}
	fp := idem.Fingerprint([]byte("POST"), []byte("/orders"), nil, []byte("x")) // method, target, Content-Type, body
	if _, _, err := g.Do(t.Context(), idemdriver.ScopedKey("", "bad"), fp, func(context.Context) ([]byte, error) {
		return []byte("not a response"), nil
	}); err != nil {
		t.Fatal(err)
	}
	a := newApp(newMW(t, st, nil))
	if w := a.do(t, "POST", "/orders", "bad", "x"); w.Code != 500 || problemCode(t, w) != "stored_response_corrupt" || a.runs.Load() != 0 {
		t.Errorf("corrupt record: %d %s, %d runs", w.Code, w.Body, a.runs.Load())
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	g, err := idem.NewGuard(memstore.New())
	if err != nil {
		t.Fatal(err)
	}
	for name, opts := range map[string][]httpmw.Option{
		"Set-Cookie":    {httpmw.WithReplayHeaders("Set-Cookie")},
		"Authorization": {httpmw.WithReplayHeaders("authorization")},
		"hop-by-hop":    {httpmw.WithReplayHeaders("Transfer-Encoding")},
		"body limit":    {httpmw.WithMaxBody(-1)},
		"wait":          {httpmw.WithWait(-time.Second)},
		"header":        {httpmw.WithKeyHeader("")},
		"method":        {httpmw.WithMethods("")},
	} {
		if _, err := httpmw.New(g, append(opts, httpmw.Unscoped())...); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if _, err := httpmw.New(nil, httpmw.Unscoped()); err == nil {
		t.Error("nil Guard: no error")
	}
	// The key space is an explicit choice, never a silent default.
	if _, err := httpmw.New(g); err == nil || !strings.Contains(err.Error(), "Unscoped") {
		t.Errorf("no scope chosen: %v; want an error naming WithScope and Unscoped", err)
	}
	if _, err := httpmw.New(g, httpmw.Unscoped(), httpmw.WithScope(func(*http.Request) string { return "" })); err == nil {
		t.Error("both WithScope and Unscoped: no error")
	}
	if _, err := httpmw.New(g, httpmw.WithScope(nil)); err == nil {
		t.Error("nil scope: no error")
	}
}

type brokenBody struct{}

func (brokenBody) Read([]byte) (int, error) { return 0, fmt.Errorf("connection reset") }

func TestUnreadableBody(t *testing.T) {
	a := newApp(newMW(t, memstore.New(), nil))
	req := httptest.NewRequest("POST", "/orders", brokenBody{})
	req.ContentLength = -1
	req.Header.Set("Idempotency-Key", "broken")
	w := httptest.NewRecorder()
	a.router.ServeHTTP(w, req)
	if w.Code != 400 || problemCode(t, w) != httpmw.CodeBodyUnreadable || a.runs.Load() != 0 {
		t.Errorf("broken body: %d %s, %d runs", w.Code, w.Body, a.runs.Load())
	}
}

// Every request is reported to the Guard's observer with its route and
// outcome, and the store operations nest under it.
func TestObserved(t *testing.T) {
	var (
		mu     sync.Mutex
		events []string
	)
	obs := observe.Func(func(_ context.Context, ev observe.Event) {
		mu.Lock()
		defer mu.Unlock()
		events = append(events, string(ev.Op)+" "+ev.Route+" "+string(ev.Outcome))
	})
	st := memstore.New(memstore.WithObserver(obs))
	a := newApp(newMW(t, st, nil, httpmw.WithRoute(func(r *http.Request) string { return r.Method + " /orders" })))
	a.do(t, "POST", "/orders", "obs", "x")
	a.do(t, "POST", "/orders", "obs", "x")
	a.do(t, "POST", "/orders", "obs", "y")
	a.do(t, "POST", "/orders", "", "x")
	want := []string{
		"idem.begin  acquired", "idem.complete  stored", "http.request POST /orders executed",
		"idem.begin  replayed", "http.request POST /orders replayed",
		"idem.begin  mismatch", "http.request POST /orders mismatch",
		"http.request POST /orders invalid",
	}
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(events, "\n") != strings.Join(want, "\n") {
		t.Errorf("events:\n%s\nwant:\n%s", strings.Join(events, "\n"), strings.Join(want, "\n"))
	}
}

// The application classifies its own answers: a business 409 sold_out
// marked Final is stored and replayed (a retry after a restock still says
// sold out), a classifier can do the same by status and header, and the
// middleware's own 409 request_in_flight is never stored.
func TestApplicationClassifiesOutcomes(t *testing.T) {
	eachStore(t, func(t *testing.T, st idemdriver.Store) {
		var runs atomic.Int64
		soldOut := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			if r.URL.Query().Get("mark") == "1" && !httpmw.Final(w) {
				t.Error("Final found no middleware writer")
			}
			w.Header().Set("X-Outcome", "sold_out")
			w.WriteHeader(http.StatusConflict)
			fmt.Fprint(w, `{"code":"sold_out"}`)
		})
		byMark := newMW(t, st, nil)(soldOut)
		byClassifier := newMW(t, st, nil, httpmw.WithFinal(func(r *http.Request, status int, h http.Header) bool {
			return h.Get("X-Outcome") == "sold_out" || httpmw.DefaultFinal(r, status, h)
		}))(soldOut)
		for _, c := range []struct {
			name   string
			h      http.Handler
			target string
			key    string
		}{
			{"Final", byMark, "/orders?mark=1", "sold-out-1"},
			{"WithFinal", byClassifier, "/orders", "sold-out-2"},
		} {
			before := runs.Load()
			for i := range 2 {
				req := httptest.NewRequest("POST", c.target, nil)
				req.Header.Set("Idempotency-Key", c.key)
				w := httptest.NewRecorder()
				c.h.ServeHTTP(w, req)
				if w.Code != http.StatusConflict || w.Body.String() != `{"code":"sold_out"}` {
					t.Errorf("%s #%d: %d %q", c.name, i, w.Code, w.Body)
				}
			}
			if n := runs.Load() - before; n != 1 {
				t.Errorf("%s: the handler ran %d times; want its 409 stored and replayed", c.name, n)
			}
		}
	})
}

// Headers set before an implicit 200 (the handler writes nothing) are part
// of the stored response.
func TestImplicitOKKeepsHeaders(t *testing.T) {
	h := newMW(t, memstore.New(), nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Location", "/done")
	}))
	for i := range 2 {
		req := httptest.NewRequest("POST", "/x", nil)
		req.Header.Set("Idempotency-Key", "implicit")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != 200 || w.Header().Get("Location") != "/done" {
			t.Errorf("#%d: %d Location %q", i, w.Code, w.Header().Get("Location"))
		}
	}
}

// The Content-Type is part of the fingerprint: the same bytes sent as
// another media type are another request.
func TestContentTypeInFingerprint(t *testing.T) {
	a := newApp(newMW(t, memstore.New(), nil))
	send := func(ct string) int {
		req := httptest.NewRequest("POST", "/orders", strings.NewReader(`a=1`))
		req.Header.Set("Idempotency-Key", "ct")
		req.Header.Set("Content-Type", ct)
		w := httptest.NewRecorder()
		a.router.ServeHTTP(w, req)
		return w.Code
	}
	if c := send("application/x-www-form-urlencoded"); c != 201 {
		t.Fatalf("first: %d", c)
	}
	if c := send("text/plain"); c != http.StatusUnprocessableEntity {
		t.Errorf("same key and body, other Content-Type: %d, want 422", c)
	}
}

// WithMaxBody(math.MaxInt64) means no limit (the limit + 1 used to
// overflow and read nothing).
func TestMaxBodyUnlimited(t *testing.T) {
	a := newApp(newMW(t, memstore.New(), nil, httpmw.WithMaxBody(math.MaxInt64)))
	w := a.do(t, "POST", "/orders", "big", "payload")
	if w.Code != 201 || !strings.Contains(w.Body.String(), `"body":"payload"`) {
		t.Errorf("%d %s", w.Code, w.Body)
	}
}

// A scope function that reads the body leaves it whole for the handler.
func TestScopeReadingBody(t *testing.T) {
	a := newApp(newScopedMW(t, memstore.New(), func(r *http.Request) string {
		b, _ := io.ReadAll(r.Body)
		return string(b[:min(len(b), 4)])
	}))
	w := a.do(t, "POST", "/orders", "scoped-body", "user-1 order")
	if !strings.Contains(w.Body.String(), `"body":"user-1 order"`) {
		t.Errorf("the handler got %s", w.Body)
	}
}

// The handler reads the request's stable stored key from its context.
func TestKeyInHandler(t *testing.T) {
	var got []string
	h := newScopedMW(t, memstore.New(), func(r *http.Request) string { return "alice" })(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k, _ := httpmw.Key(r.Context())
		got = append(got, k)
		w.WriteHeader(http.StatusInternalServerError) // not stored: the retry runs again
	}))
	for range 2 {
		req := httptest.NewRequest("POST", "/x", nil)
		req.Header.Set("Idempotency-Key", "k1")
		h.ServeHTTP(httptest.NewRecorder(), req)
	}
	if len(got) != 2 || got[0] == "" || got[0] != got[1] || got[0] != idemdriver.ScopedKey("alice", "k1") {
		t.Errorf("keys in the handler %q; want the same stored key on every run", got)
	}
}

// WithPlacement places the stored key by a function of the request (here
// of its body, which the handler still gets whole); a place that cannot be
// one is a 400 with nothing run, and a nil function a construction error.
func TestPlacement(t *testing.T) {
	var got []string
	mw := newScopedMW(t, memstore.New(), func(r *http.Request) string { return "alice" },
		httpmw.WithPlacement(func(r *http.Request) string {
			b, _ := io.ReadAll(r.Body)
			return strings.TrimPrefix(string(b), "sku=")
		}))
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k, _ := httpmw.Key(r.Context())
		b, _ := io.ReadAll(r.Body)
		got = append(got, k+" "+string(b))
		w.WriteHeader(http.StatusCreated)
	}))
	send := func(body string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("POST", "/x", strings.NewReader(body))
		req.Header.Set("Idempotency-Key", "k1")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w
	}
	if w := send("sku=tv-1"); w.Code != http.StatusCreated {
		t.Fatalf("placed request: %d %s", w.Code, w.Body)
	}
	want, _ := idem.Placed("tv-1", idemdriver.ScopedKey("alice", "k1"))
	if len(got) != 1 || got[0] != want+" sku=tv-1" {
		t.Errorf("the handler saw %q, want the key %q and the whole body", got, want)
	}
	if w := send("sku=a}b"); w.Code != http.StatusBadRequest || problemCode(t, w) != httpmw.CodeKeyInvalid || len(got) != 1 {
		t.Errorf("a place with a brace: %d %s, %d runs", w.Code, problemCode(t, w), len(got))
	}
	g, _ := idem.NewGuard(memstore.New())
	if _, err := httpmw.New(g, httpmw.Unscoped(), httpmw.WithPlacement(nil)); err == nil {
		t.Error("a nil placement function was accepted")
	}
}

// JSONFingerprint: a retry that re-serialises its JSON body (member
// order, whitespace, a charset parameter) is the same request and is
// replayed; another value is 422; a body that is not JSON is 400 with
// nothing run. The default fingerprint tells the re-serialised body apart.
func TestJSONFingerprint(t *testing.T) {
	send := func(a *app, key, ct, body string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("POST", "/orders", strings.NewReader(body))
		req.Header.Set("Idempotency-Key", key)
		req.Header.Set("Content-Type", ct)
		w := httptest.NewRecorder()
		a.router.ServeHTTP(w, req)
		return w
	}
	a := newApp(newMW(t, memstore.New(), nil, httpmw.WithFingerprint(httpmw.JSONFingerprint)))
	first := send(a, "j1", "application/json", `{"sku":"tv-1","qty":1}`)
	again := send(a, "j1", "Application/JSON; charset=utf-8", "{\n  \"qty\": 1,\n  \"sku\": \"tv-1\"\n}")
	if first.Code != 201 || again.Code != 201 || again.Header().Get(httpmw.ReplayedHeader) != "true" || a.runs.Load() != 1 {
		t.Errorf("a re-serialised retry: %d %v, %d runs; want the first response replayed", again.Code, again.Header(), a.runs.Load())
	}
	if w := send(a, "j1", "application/json", `{"sku":"tv-1","qty":2}`); w.Code != http.StatusUnprocessableEntity {
		t.Errorf("another body under the key: %d, want 422", w.Code)
	}
	if w := send(a, "j2", "application/json", `{"sku":`); w.Code != http.StatusBadRequest || problemCode(t, w) != httpmw.CodeBodyInvalid || a.runs.Load() != 1 {
		t.Errorf("a body that is not JSON: %d %s, %d runs", w.Code, problemCode(t, w), a.runs.Load())
	}
	d := newApp(newMW(t, memstore.New(), nil))
	send(d, "j1", "application/json", `{"sku":"tv-1","qty":1}`)
	if w := send(d, "j1", "application/json", `{"qty":1,"sku":"tv-1"}`); w.Code != http.StatusUnprocessableEntity {
		t.Errorf("the default fingerprint took a reordered body as the same request: %d", w.Code)
	}
	g, _ := idem.NewGuard(memstore.New())
	if _, err := httpmw.New(g, httpmw.Unscoped(), httpmw.WithFingerprint(nil)); err == nil {
		t.Error("a nil fingerprint function was accepted")
	}
}

// WithKeyExtractor: a key from the body when there is no header (the
// handler still gets the body whole), the header winning over it, an
// extracted key held to the header's rules, and a request without either
// answered as one without a key.
func TestKeyExtractor(t *testing.T) {
	a := newApp(newMW(t, memstore.New(), nil, httpmw.WithKeyExtractor(func(r *http.Request) (string, bool) {
		var body struct {
			RequestID string `json:"request_id"`
		}
		if json.NewDecoder(r.Body).Decode(&body) != nil || body.RequestID == "" {
			return "", false
		}
		return body.RequestID, true
	})))
	first := a.do(t, "POST", "/orders", "", `{"request_id":"r-1","sku":"tv-1"}`)
	again := a.do(t, "POST", "/orders", "", `{"request_id":"r-1","sku":"tv-1"}`)
	if first.Code != 201 || !strings.Contains(first.Body.String(), `request_id`) || again.Header().Get(httpmw.ReplayedHeader) != "true" || a.runs.Load() != 1 {
		t.Errorf("a key from the body: %d %s, then %v; %d runs", first.Code, first.Body, again.Header(), a.runs.Load())
	}
	if w := a.do(t, "POST", "/orders", "h-1", `{"request_id":"r-1","sku":"tv-1"}`); w.Header().Get(httpmw.ReplayedHeader) != "" || a.runs.Load() != 2 {
		t.Errorf("the header did not win over the body's key: %v", w.Header())
	}
	if w := a.do(t, "POST", "/orders", "", `{"request_id":"r 1"}`); w.Code != 400 || problemCode(t, w) != httpmw.CodeKeyInvalid {
		t.Errorf("an extracted key with a space: %d %s", w.Code, problemCode(t, w))
	}
	if w := a.do(t, "POST", "/orders", "", `{"sku":"tv-1"}`); w.Code != 400 || problemCode(t, w) != httpmw.CodeKeyMissing || a.runs.Load() != 2 {
		t.Errorf("no key anywhere: %d %s", w.Code, problemCode(t, w))
	}
}

// A client that times out and retries while its first request still runs
// must not get a second concurrent run, even after the claim's lease
// would have run out (the claim lives until the handler returns).
func TestClientTimeoutThenRetry(t *testing.T) {
	eachStore(t, func(t *testing.T, st idemdriver.Store) {
		var running, runs, overlaps atomic.Int32
		release := make(chan struct{})
		handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			if running.Add(1) > 1 {
				overlaps.Add(1)
			}
			defer running.Add(-1)
			// Ignores the client's cancellation, as many handlers do, and
			// runs past several TTLs: until the test has retried (a loaded
			// machine's sleep could otherwise outlast a fixed run time).
			select {
			case <-release:
			case <-time.After(10 * time.Second):
			}
			w.WriteHeader(http.StatusCreated)
		})
		srv := httptest.NewServer(newMW(t, st, []idem.Option{idem.WithTTL(300 * time.Millisecond)})(handler))
		defer srv.Close()
		send := func(timeout time.Duration) (int, error) {
			req, _ := http.NewRequest("POST", srv.URL+"/orders", nil)
			req.Header.Set("Idempotency-Key", "timeout-retry")
			resp, err := (&http.Client{Timeout: timeout}).Do(req)
			if err != nil {
				return 0, err
			}
			resp.Body.Close()
			return resp.StatusCode, nil
		}
		if _, err := send(100 * time.Millisecond); err == nil {
			t.Fatal("the first request did not time out")
		}
		time.Sleep(500 * time.Millisecond) // the claim outlives its 300 ms TTL
		if code, err := send(5 * time.Second); err != nil || code != http.StatusConflict {
			t.Errorf("retry while the first run goes on: %d %v; want 409 in flight", code, err)
		}
		close(release)
		var code int
		var err error
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			code, err = send(5 * time.Second)
			if err != nil || code != http.StatusConflict || time.Now().After(deadline) {
				break // (409 until the first run has stored its answer)
			}
		}
		if err != nil || code != http.StatusCreated {
			t.Errorf("retry after the first run: %d %v; want its 201 replayed", code, err)
		}
		if runs.Load() != 1 || overlaps.Load() != 0 {
			t.Errorf("%d runs, %d overlapping; want 1 and 0", runs.Load(), overlaps.Load())
		}
	})
}

// stockEffect returns an effect of st's driver that takes one from a stock
// of 10, and a function reading the stock.
func stockEffect(t *testing.T, st idemdriver.Store) (any, func() int) {
	t.Helper()
	switch st.(type) {
	case *memstore.Store:
		var mu sync.Mutex
		stock := 10
		return memstore.Effect(func() error {
				mu.Lock()
				defer mu.Unlock()
				stock--
				return nil
			}), func() int {
				mu.Lock()
				defer mu.Unlock()
				return stock
			}
	case *redisstore.Store:
		c := redis.NewClient(&redis.Options{Addr: testenv.RedisAddrs(t, 1)[0]})
		t.Cleanup(func() { _ = c.Close() })
		key := fmt.Sprintf("httpmw-test:stock:%d", time.Now().UnixNano())
		if err := c.Set(t.Context(), key, 10, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		return redisstore.Effect{Script: takeOne, Keys: []string{key}}, func() int {
			n, err := c.Get(context.Background(), key).Int()
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no stock effect for %T", st)
	return nil, nil
}

var takeOne = redisstore.NewEffectScript(`redis.call('DECR', KEYS[1])`)

// A handler that commits an effect and then answers with a success that
// cannot be stored (over WithMaxResponse, or not final under WithFinal)
// has neither its response nor its effect committed: the client must not
// get that success, which it would take for done. It gets 500
// effect_not_committed, the stock is untouched, and a retry with the same
// key runs again. An error answer is passed on as it is (nothing was done,
// and it says so).
func TestCommitWithUnstoredResponse(t *testing.T) {
	cases := []struct {
		name     string
		opts     []httpmw.Option
		status   int
		body     string
		wantCode int
	}{
		{"over the limit", []httpmw.Option{httpmw.WithMaxResponse(16)}, http.StatusCreated, strings.Repeat("x", 64), http.StatusInternalServerError},
		{"not final", []httpmw.Option{httpmw.WithFinal(func(_ *http.Request, status int, _ http.Header) bool { return status != http.StatusAccepted })},
			http.StatusAccepted, "queued", http.StatusInternalServerError},
		{"error answer", nil, http.StatusServiceUnavailable, "busy", http.StatusServiceUnavailable},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			eachStore(t, func(t *testing.T, st idemdriver.Store) {
				effect, stock := stockEffect(t, st)
				var runs atomic.Int64
				h := newMW(t, st, nil, tc.opts...)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					runs.Add(1)
					if err := httpmw.Commit(w, effect); err != nil {
						t.Error(err)
					}
					w.WriteHeader(tc.status)
					io.WriteString(w, tc.body)
				}))
				for i := range 2 {
					req := httptest.NewRequest("POST", "/orders", strings.NewReader("{}"))
					req.Header.Set("Idempotency-Key", "k-unstored")
					w := httptest.NewRecorder()
					h.ServeHTTP(w, req)
					if w.Code != tc.wantCode {
						t.Errorf("try %d: status %d %q, want %d", i, w.Code, w.Body, tc.wantCode)
					}
					if tc.wantCode == http.StatusInternalServerError && problemCode(t, w) != httpmw.CodeEffectNotCommitted {
						t.Errorf("try %d: problem %q, want %s", i, w.Body, httpmw.CodeEffectNotCommitted)
					}
				}
				if n := stock(); n != 10 {
					t.Errorf("stock %d after two answers that were not committed, want 10", n)
				}
				if n := runs.Load(); n != 2 {
					t.Errorf("handler ran %d times, want 2 (nothing was stored, so the retry runs)", n)
				}
			})
		})
	}
}

// callerTxEffect stands for sqlstore.InTx: an effect whose transaction the
// caller commits after Guard.Do returns.
type callerTxEffect struct{}

func (callerTxEffect) CallerCommits() {}

// An effect the caller's own transaction would commit (sqlstore.InTx) is
// refused under the middleware, which answers as soon as Guard.Do
// returns: Commit says so, the handler answers its error, and nothing is
// stored, so the retry runs again.
func TestCommitRefusesCallerTransaction(t *testing.T) {
	mw := newMW(t, memstore.New(), nil)
	var commitErr error
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if commitErr = httpmw.Commit(w, callerTxEffect{}); commitErr != nil {
			http.Error(w, commitErr.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader("{}"))
	req.Header.Set("Idempotency-Key", "caller-tx")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if !errors.Is(commitErr, idem.ErrCallerCommits) {
		t.Fatalf("Commit of a caller-committed effect = %v, want idem.ErrCallerCommits", commitErr)
	}
	if rec.Code != http.StatusInternalServerError {
		t.Errorf("status %d, want the handler's 500", rec.Code)
	}
}

// A request's claim outlives the request (idemdriver.ClaimOutlivesCaller): the
// store's Begin is not under the request's cancellation, so a store can
// make it on the handler's goroutine; the claim of a request that left
// meanwhile is given back.
func TestClaimOutlivesRequest(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	mem, ended := memstore.New(), make(chan error, 1)
	st := idemtest.BeforeBegin(mem, func(bctx context.Context) {
		cancel() // the client hangs up while its claim is on the way
		ended <- bctx.Err()
	})
	h := newMW(t, st, nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Error("the handler ran for a request that had left")
	}))
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/orders", strings.NewReader("{}"))
	req.Header.Set("Idempotency-Key", "k-outlives")
	h.ServeHTTP(httptest.NewRecorder(), req)
	if err := <-ended; err != nil {
		t.Errorf("the claim's context ended with the request's: %v", err)
	}
	stored, err := idemdriver.StoredKey("", "", "k-outlives", "") // Unscoped
	if err != nil {
		t.Fatal(err)
	}
	if c, err := mem.Begin(t.Context(), stored, "other", time.Second); err != nil || c.State != idemdriver.Acquired {
		t.Errorf("the left request's claim: Begin = %v, %v; want the key given back", c.State, err)
	}
}
