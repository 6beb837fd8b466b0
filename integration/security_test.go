package integration_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/observe"
	"github.com/oncekit/oncekit/examples/inventory"
	"github.com/oncekit/oncekit/examples/inventory/inventorypb"
	"github.com/oncekit/oncekit/grpcmw"
	"github.com/oncekit/oncekit/httpmw"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/kafkamw"
	"github.com/oncekit/oncekit/storage"
	"github.com/oncekit/oncekit/storage/etcdstore"
	"github.com/oncekit/oncekit/storage/memstore"
	"github.com/oncekit/oncekit/storage/redisstore"
)

// What a request carries that must never reach storage or logs in clear:
// its idempotency key, the client's credentials, and the response's cookie
// and token. The store holds hashed keys and replays no Set-Cookie or
// Authorization; the log names keys by hash.
func TestSecretsNotStored(t *testing.T) {
	for _, name := range []string{"redis", "etcd"} {
		t.Run(name, func(t *testing.T) {
			o, err := storage.Open(context.Background(), stores(t)[name])
			if err != nil {
				t.Fatal(err)
			}
			defer o.Close()
			var logs bytes.Buffer
			var logMu sync.Mutex
			logger := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
				logMu.Lock()
				defer logMu.Unlock()
				return logs.Write(p)
			}), &slog.HandlerOptions{Level: slog.LevelDebug}))
			g, err := idem.NewGuard(o, idem.WithObserver(observe.Logger(logger)))
			if err != nil {
				t.Fatal(err)
			}
			mw, err := httpmw.New(g, httpmw.WithScope(func(r *http.Request) string { return r.Header.Get("X-User") }))
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Set-Cookie", "session=SECRET-COOKIE")
				w.Header().Set("Authorization", "Bearer SECRET-TOKEN")
				w.WriteHeader(http.StatusCreated)
				fmt.Fprint(w, "created")
			})))
			defer srv.Close()
			nonce := time.Now().UnixNano()
			rawKey := fmt.Sprintf("RAW-KEY-%d", nonce)
			send := func() *http.Response {
				req, _ := http.NewRequest("POST", srv.URL+"/orders", strings.NewReader(`{"card":"4111"}`))
				req.Header.Set("Idempotency-Key", rawKey)
				req.Header.Set("Authorization", "Bearer CLIENT-SECRET")
				req.Header.Set("X-User", "alice")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				return resp
			}
			send()
			replay := send()
			if replay.Header.Get("Idempotent-Replayed") != "true" || replay.Header.Get("Set-Cookie") != "" || replay.Header.Get("Authorization") != "" {
				t.Errorf("replay headers %v: a cookie or a token was replayed", replay.Header)
			}
			secrets := []string{rawKey, "SECRET-COOKIE", "SECRET-TOKEN", "CLIENT-SECRET"}
			for _, kv := range dump(t, o) {
				for _, s := range secrets {
					if strings.Contains(kv, s) {
						t.Errorf("stored in clear: %q in %.120q", s, kv)
					}
				}
			}
			logMu.Lock()
			defer logMu.Unlock()
			if strings.Contains(logs.String(), rawKey) {
				t.Errorf("the raw key is in the log:\n%s", logs.String())
			}
			if !strings.Contains(logs.String(), "key_hash=") {
				t.Errorf("the log names no key (hashed) at all:\n%s", logs.String())
			}
		})
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// dump returns every key and value the store's server holds under
// oncekit's prefixes, as "key=value" strings.
func dump(t *testing.T, o storage.Store) []string {
	ctx := context.Background()
	var out []string
	switch d := o.(type) {
	case *redisstore.Store:
		rc := d.Client().(redis.UniversalClient)
		iter := rc.Scan(ctx, 0, "oncekit:*", 1000).Iterator()
		for iter.Next(ctx) {
			k := iter.Val()
			typ, _ := rc.Type(ctx, k).Result()
			var v string
			switch typ {
			case "hash":
				m, _ := rc.HGetAll(ctx, k).Result()
				v = fmt.Sprint(m)
			case "string":
				v, _ = rc.Get(ctx, k).Result()
			default:
				v = typ
			}
			out = append(out, k+"="+v)
		}
		if err := iter.Err(); err != nil {
			t.Fatal(err)
		}
	case *etcdstore.Store:
		resp, err := d.Client().Get(ctx, "oncekit/", clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		for _, kv := range resp.Kvs {
			out = append(out, string(kv.Key)+"="+string(kv.Value))
		}
	}
	if len(out) == 0 {
		t.Fatal("found nothing stored: the dump looks in the wrong place")
	}
	return out
}

// One principal can never replay another's answer: the same key from two
// users is two orders over HTTP and gRPC, and the same message-id from two
// tenants is two messages on Kafka.
func TestNoCrossPrincipalReplay(t *testing.T) {
	store, backend, closeStore, err := inventory.Open(stores(t)["redis"], fmt.Sprintf("sec:%d:", time.Now().UnixNano()), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer closeStore()
	svc, err := inventory.New(inventory.Config{Store: store, Backend: backend})
	if err != nil {
		t.Fatal(err)
	}
	r, err := inventory.Start(svc, "127.0.0.1:0", "127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	sku := fmt.Sprintf("sec-%d", time.Now().UnixNano()%1e9)
	key := fmt.Sprintf("shared-key-%d", time.Now().UnixNano())
	put, _ := http.NewRequest("PUT", "http://"+r.HTTPAddr+"/v1/items/"+sku, strings.NewReader(`{"stock":10}`))
	if resp, err := http.DefaultClient.Do(put); err != nil || resp.StatusCode != 200 {
		t.Fatalf("PUT: %v", err)
	}

	// HTTP: the scope is the order's user.
	ids := map[string]bool{}
	for _, user := range []string{"alice", "mallory"} {
		req, _ := http.NewRequest("POST", "http://"+r.HTTPAddr+"/v1/orders",
			strings.NewReader(fmt.Sprintf(`{"sku":%q,"qty":1,"user":%q}`, sku, user)))
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 201 || resp.Header.Get("Idempotent-Replayed") != "" {
			t.Errorf("HTTP order of %s with a key another user used: %d replayed=%q", user, resp.StatusCode, resp.Header.Get("Idempotent-Replayed"))
		}
		ids[resp.Header.Get("Location")] = true
	}
	if len(ids) != 2 {
		t.Errorf("two users' orders with one key share an order: %v", ids)
	}

	// gRPC: the scope is the caller's principal (x-user metadata here).
	conn, err := grpc.NewClient(r.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := inventorypb.NewInventoryClient(conn)
	orders := map[string]bool{}
	for _, user := range []string{"alice", "mallory"} {
		var md metadata.MD
		ctx := metadata.AppendToOutgoingContext(context.Background(), grpcmw.DefaultMetadataKey, key+"-grpc", inventory.UserMetadataKey, user)
		o, err := c.PlaceOrder(ctx, &inventorypb.PlaceOrderRequest{Sku: sku, Qty: 1, User: user}, grpc.Header(&md))
		if err != nil || len(md.Get(grpcmw.ReplayedMetadataKey)) != 0 {
			t.Errorf("gRPC order of %s: %v, replayed %v", user, err, md.Get(grpcmw.ReplayedMetadataKey))
			continue
		}
		orders[o.GetOrderId()] = true
	}
	if len(orders) != 2 {
		t.Errorf("two users' gRPC orders with one key share an order: %v", orders)
	}

	// Kafka: the scope is the message's tenant header.
	brokers := testenv.KafkaBrokers(t)
	topic := testenv.KafkaTopic(t, brokers, 1)
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, Transport: tr, BatchTimeout: time.Millisecond}
	defer w.Close()
	msg := func(tenant string) kafka.Message {
		return kafka.Message{Value: []byte("refund"), Headers: []kafka.Header{
			{Key: kafkamw.DefaultKeyHeader, Value: []byte("msg-1")}, {Key: "tenant", Value: []byte(tenant)}}}
	}
	if err := w.WriteMessages(context.Background(), msg("alice"), msg("mallory"), msg("alice")); err != nil {
		t.Fatal(err)
	}
	guard, _ := idem.NewGuard(memstore.New())
	rd := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, GroupID: "g-" + topic, MaxWait: 50 * time.Millisecond,
		HeartbeatInterval: 100 * time.Millisecond, SessionTimeout: time.Second})
	defer rd.Close()
	var mu sync.Mutex
	handled := map[string]int{}
	cons, err := kafkamw.NewConsumer(kafkamw.KafkaGoReader(rd), guard, func(ctx context.Context, m kafkamw.Message) error {
		mu.Lock()
		defer mu.Unlock()
		for _, h := range m.Headers {
			if h.Key == "tenant" {
				handled[string(h.Value)]++
			}
		}
		return nil
	}, kafkamw.WithScope(func(m kafkamw.Message) string {
		for _, h := range m.Headers {
			if h.Key == "tenant" {
				return "tenant:" + string(h.Value)
			}
		}
		return ""
	}))
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = cons.Run(context.Background()) }()
	deadline := time.Now().Add(30 * time.Second)
	for s := cons.Stats(); s.Handled+s.Duplicates < 3; s = cons.Stats() {
		if time.Now().After(deadline) {
			t.Fatalf("consumer stats %+v", s)
		}
		time.Sleep(10 * time.Millisecond)
	}
	_ = cons.Shutdown(context.Background())
	if handled["alice"] != 1 || handled["mallory"] != 1 {
		t.Errorf("handled per tenant %v, want alice once and mallory once", handled)
	}
}
