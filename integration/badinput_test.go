package integration_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/examples/inventory"
	"github.com/oncekit/oncekit/grpcmw"
	"github.com/oncekit/oncekit/httpmw"
	"github.com/oncekit/oncekit/kafkamw"
	"github.com/oncekit/oncekit/storage"
	"github.com/oncekit/oncekit/storage/etcdstore"
	"github.com/oncekit/oncekit/storage/memstore"
	"github.com/oncekit/oncekit/storage/redisstore"
	"github.com/oncekit/oncekit/storage/redlockstore"
)

// noPanic runs f and fails the test if it panics.
func noPanic(t *testing.T, what string, f func()) {
	t.Helper()
	defer func() {
		if p := recover(); p != nil {
			t.Errorf("%s panicked: %v", what, p)
		}
	}()
	f()
}

// Every constructor refuses what it cannot work with, with an error and
// no panic.
func TestConstructorsRejectBadInput(t *testing.T) {
	g, err := idem.NewGuard(memstore.New())
	if err != nil {
		t.Fatal(err)
	}
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: []string{"127.0.0.1:1"}, Topic: "t", GroupID: "g"})
	defer r.Close()
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	cases := map[string]func() error{
		"redisstore.New(nil)":                 func() error { _, err := redisstore.New(nil); return err },
		"redisstore.New(ring)":                func() error { _, err := redisstore.New(redis.NewRing(&redis.RingOptions{})); return err },
		"redlockstore.New(nil)":               func() error { _, err := redlockstore.New(nil); return err },
		"redlockstore.New(2 nodes)":           func() error { _, err := redlockstore.New([]redlockstore.Client{c, c}); return err },
		"redlockstore.New(same node 3 times)": func() error { _, err := redlockstore.New([]redlockstore.Client{c, c, c}); return err },
		"etcdstore.New(nil)":                  func() error { _, err := etcdstore.New(nil); return err },
		"idem.NewGuard(nil)":                  func() error { _, err := idem.NewGuard(nil); return err },
		"idem.WithTTL(0)":                     func() error { _, err := idem.NewGuard(memstore.New(), idem.WithTTL(0)); return err },
		"idem.WithMaxResult(-1)":              func() error { _, err := idem.NewGuard(memstore.New(), idem.WithMaxResult(-1)); return err },
		"lock.NewMutex(nil)":                  func() error { _, err := lock.NewMutex(nil); return err },
		"lock.WithTTL(-1)":                    func() error { _, err := lock.NewMutex(memstore.New(), lock.WithTTL(-time.Second)); return err },
		"httpmw.New(nil)":                     func() error { _, err := httpmw.New(nil, httpmw.Unscoped()); return err },
		"httpmw.New(no scope)":                func() error { _, err := httpmw.New(g); return err },
		"httpmw.New(scope and unscoped)": func() error {
			_, err := httpmw.New(g, httpmw.Unscoped(), httpmw.WithScope(func(*http.Request) string { return "" }))
			return err
		},
		"httpmw.WithMaxBody(-1)":                  func() error { _, err := httpmw.New(g, httpmw.Unscoped(), httpmw.WithMaxBody(-1)); return err },
		"httpmw.WithKeyHeader(\"\")":              func() error { _, err := httpmw.New(g, httpmw.Unscoped(), httpmw.WithKeyHeader("")); return err },
		"grpcmw.UnaryServerInterceptor(nil)":      func() error { _, err := grpcmw.UnaryServerInterceptor(nil, grpcmw.Unscoped()); return err },
		"grpcmw.UnaryServerInterceptor(no scope)": func() error { _, err := grpcmw.UnaryServerInterceptor(g); return err },
		"grpcmw.StreamServerInterceptor(nil)":     func() error { _, err := grpcmw.StreamServerInterceptor(nil, grpcmw.Unscoped()); return err },
		"kafkamw.NewConsumer(nil reader)": func() error {
			_, err := kafkamw.NewConsumer(nil, g, func(context.Context, kafkamw.Message) error { return nil })
			return err
		},
		"kafkamw.NewConsumer(nil handler)": func() error { _, err := kafkamw.NewConsumer(kafkamw.KafkaGoReader(r), g, nil); return err },
		"kafkamw.NewProducer(nil)":         func() error { _, err := kafkamw.NewProducer(nil); return err },
		"storage.Open(\"\")":               func() error { _, err := storage.Open(context.Background(), ""); return err },
		"storage.Open(ftp://)":             func() error { _, err := storage.Open(context.Background(), "ftp://x"); return err },
		"storage.Open(no scheme)":          func() error { _, err := storage.Open(context.Background(), "127.0.0.1:6379"); return err },
		"storage.Open(redlock no hosts)":   func() error { _, err := storage.Open(context.Background(), "redlock://"); return err },
		"storage.Open(bad redis db)": func() error {
			_, err := storage.Open(context.Background(), "redis://127.0.0.1:6379/notadb")
			return err
		},
		"inventory.New(nil)": func() error { _, err := inventory.New(inventory.Config{}); return err },
	}
	for name, f := range cases {
		noPanic(t, name, func() {
			if err := f(); err == nil {
				t.Errorf("%s: no error", name)
			}
		})
	}
}

// Every driver refuses bad keys, TTLs and owners with the documented
// errors, before any round trip, and never panics.
func TestDriversRejectBadInput(t *testing.T) {
	for name, url := range map[string]string{"memory": "memory://", "redis": stores(t)["redis"], "redlock": stores(t)["redlock"], "etcd": stores(t)["etcd"],
		"postgres": stores(t)["postgres"], "mysql": stores(t)["mysql"], "zk": stores(t)["zk"]} {
		t.Run(name, func(t *testing.T) {
			o, err := storage.Open(context.Background(), url)
			if err != nil {
				t.Fatal(err)
			}
			defer o.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			long := strings.Repeat("k", lock.MaxKeyLen+1)
			for _, tc := range []struct {
				key  string
				ttl  time.Duration
				want error
			}{
				{"", time.Second, lock.ErrInvalidKey},
				{long, time.Second, lock.ErrInvalidKey},
				{"k", 0, lock.ErrInvalidTTL},
				{"k", -time.Second, lock.ErrInvalidTTL},
				{"k", time.Microsecond, lock.ErrInvalidTTL},
			} {
				noPanic(t, "Acquire", func() {
					if _, err := o.TryAcquire(ctx, tc.key, tc.ttl); !errors.Is(err, tc.want) {
						t.Errorf("TryAcquire(%.10q, %v): %v, want %v", tc.key, tc.ttl, err, tc.want)
					}
					if _, err := o.Acquire(ctx, tc.key, tc.ttl); !errors.Is(err, tc.want) {
						t.Errorf("Acquire(%.10q, %v): %v, want %v", tc.key, tc.ttl, err, tc.want)
					}
				})
			}
			// Binary keys are keys: any bytes, within the length limit.
			noPanic(t, "binary key", func() {
				l, err := o.TryAcquire(ctx, fmt.Sprintf("bin-\x00\xff{}\n-%d", time.Now().UnixNano()), time.Second)
				if err != nil {
					t.Errorf("binary key: %v", err)
					return
				}
				_ = l.Release(ctx)
			})
			g, err := idem.NewGuard(o)
			if err != nil {
				t.Fatal(err)
			}
			noPanic(t, "Guard.Do", func() {
				if _, _, err := g.Do(ctx, "", "fp", func(context.Context) ([]byte, error) { return nil, nil }); !errors.Is(err, lock.ErrInvalidKey) {
					t.Errorf("Do with an empty key: %v", err)
				}
				if _, _, err := g.Do(ctx, fmt.Sprintf("nil-run-%d", time.Now().UnixNano()), "fp", nil); err == nil {
					t.Error("Do with a nil run on a free key: no error")
				}
				if _, err := o.Begin(ctx, idemdriver.MustKey("k"), "fp", 0); err == nil {
					t.Error("Begin with a zero lease: no error")
				}
			})
		})
	}
}

// The middleware answers malformed requests with a problem and runs
// nothing: a malformed key, huge keys and bodies, binary bytes.
func TestMiddlewareRejectsBadRequests(t *testing.T) {
	g, err := idem.NewGuard(memstore.New())
	if err != nil {
		t.Fatal(err)
	}
	mw, err := httpmw.New(g, httpmw.Unscoped(), httpmw.WithMaxBody(1<<10))
	if err != nil {
		t.Fatal(err)
	}
	runs := 0
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { runs++ })))
	defer srv.Close()
	for name, tc := range map[string]struct {
		key, body string
		status    int
	}{
		"no key":         {"", "x", 400},
		"long key":       {strings.Repeat("k", 256), "x", 400},
		"binary key":     {"a\xffb", "x", 400},
		"space in key":   {"a b", "x", 400},
		"unclosed quote": {`"abc`, "x", 400},
		"huge body":      {"k1", strings.Repeat("x", 2<<10), 413},
	} {
		req, _ := http.NewRequest("POST", srv.URL, strings.NewReader(tc.body))
		if tc.key != "" {
			req.Header["Idempotency-Key"] = []string{tc.key}
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.status || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/problem+json") {
			t.Errorf("%s: %d %s, want %d problem+json", name, resp.StatusCode, resp.Header.Get("Content-Type"), tc.status)
		}
	}
	if runs != 0 {
		t.Errorf("the handler ran %d times on bad requests", runs)
	}
}
