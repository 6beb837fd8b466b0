package inventory_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/examples/inventory"
	"github.com/oncekit/oncekit/examples/inventory/flashsale"
	"github.com/oncekit/oncekit/examples/inventory/inventorypb"
	"github.com/oncekit/oncekit/grpcmw"
	"github.com/oncekit/oncekit/kafkamw/kafkamwtest"
	"github.com/oncekit/oncekit/observe/otelobs"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// stores are the store URLs the service runs on: every driver. The
// servers come from REDIS_ADDRS, REDIS_CLUSTER_ADDRS, ETCD_ENDPOINTS, POSTGRES_URL, MYSQL_URL,
// PGBOUNCER_URL and ZOOKEEPER_ADDRS (comma-separated, as
// `make services-up` prints them); a store whose servers are not named is
// skipped, or fails under ONCEKIT_REQUIRE_SERVERS=1.
var stores = map[string]func(t *testing.T) string{
	"memory": func(*testing.T) string { return "memory://" },
	"redis":  func(t *testing.T) string { return "redis://" + servers(t, "REDIS_ADDRS", 1)[0] },
	"redis-cluster": func(t *testing.T) string {
		return "redis-cluster://" + strings.Join(servers(t, "REDIS_CLUSTER_ADDRS", 3), ",")
	},
	"redis-sentinel": func(t *testing.T) string {
		return "redis-sentinel://" + strings.Join(servers(t, "REDIS_SENTINEL_ADDRS", 3), ",") + "?master_name=" + servers(t, "REDIS_SENTINEL_MASTER", 1)[0]
	},
	"redlock":  func(t *testing.T) string { return "redlock://" + strings.Join(servers(t, "REDIS_ADDRS", 5), ",") },
	"etcd":     func(t *testing.T) string { return "etcd://" + strings.Join(servers(t, "ETCD_ENDPOINTS", 1), ",") },
	"postgres": func(t *testing.T) string { return servers(t, "POSTGRES_URL", 1)[0] },
	"mysql":    func(t *testing.T) string { return servers(t, "MYSQL_URL", 1)[0] },
	// PostgreSQL behind pgbouncer in transaction pooling mode: waiters
	// poll (no LISTEN), statements are not prepared by name.
	"postgres-pgbouncer": func(t *testing.T) string {
		return servers(t, "PGBOUNCER_URL", 1)[0] + "&notify=false&default_query_exec_mode=exec"
	},
	"zk": func(t *testing.T) string { return "zk://" + strings.Join(servers(t, "ZOOKEEPER_ADDRS", 1), ",") },
}

// servers returns the first n addresses listed in env, or skips t (fails
// it under ONCEKIT_REQUIRE_SERVERS=1, as `make test` runs). The example
// builds outside this repository, so it has its own copy of the rule the
// repository's tests take from internal/testenv.
func servers(t *testing.T, env string, n int) []string {
	t.Helper()
	var addrs []string
	for _, a := range strings.Split(os.Getenv(env), ",") {
		if a = strings.TrimSpace(a); a != "" {
			addrs = append(addrs, a)
		}
	}
	if len(addrs) >= n {
		return addrs[:n]
	}
	msg := fmt.Sprintf("%s names %d servers, this test needs %d (run `make services-up`)", env, len(addrs), n)
	if os.Getenv("ONCEKIT_REQUIRE_SERVERS") == "1" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return nil
}

func eachStore(t *testing.T, f func(t *testing.T, url string)) {
	for _, name := range []string{"memory", "redis", "redis-cluster", "redlock", "etcd", "postgres", "postgres-pgbouncer", "mysql", "zk"} {
		t.Run(name, func(t *testing.T) { f(t, stores[name](t)) })
	}
}

// open returns a fresh service on url (its own key prefix).
func open(t *testing.T, url string) *inventory.Service {
	t.Helper()
	store, backend, closeStore, err := inventory.Open(url, fmt.Sprintf("inv-test:%d:", time.Now().UnixNano()), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(closeStore)
	svc, err := inventory.New(inventory.Config{Store: store, Backend: backend})
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

func serveHTTP(t *testing.T, svc *inventory.Service) string {
	h, err := svc.Handler()
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

type response struct {
	status   int
	body     string
	replayed bool
	code     string
	orderID  string
}

func do(t *testing.T, method, url, key, body string) response {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", runID+"-"+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var p struct {
		Code    string `json:"code"`
		OrderID string `json:"order_id"`
	}
	_ = json.Unmarshal(b, &p)
	return response{status: resp.StatusCode, body: string(b), replayed: resp.Header.Get("Idempotent-Replayed") == "true",
		code: p.Code, orderID: p.OrderID}
}

// runID makes this run's idempotency keys its own: the servers keep
// records between runs.
var runID = fmt.Sprintf("%x", time.Now().UnixNano())

func order(sku, user string, qty int) string {
	return fmt.Sprintf(`{"sku":%q,"qty":%d,"user":%q}`, sku, qty, user)
}

func TestHTTPAPI(t *testing.T) {
	eachStore(t, func(t *testing.T, url string) {
		base := serveHTTP(t, open(t, url))
		sku := fmt.Sprintf("phone-%d", time.Now().UnixNano()%1e6)

		if r := do(t, "PUT", base+"/v1/items/"+sku, "", `{"stock":1}`); r.status != 200 ||
			r.body != fmt.Sprintf(`{"sku":%q,"stock":1,"sold":0}`+"\n", sku) {
			t.Fatalf("PUT item: %d %s", r.status, r.body)
		}
		first := do(t, "POST", base+"/v1/orders", "k1", order(sku, "ann", 1))
		if first.status != 201 || first.orderID == "" || first.replayed || !strings.Contains(first.body, `"fence":`) {
			t.Fatalf("order: %d %s", first.status, first.body)
		}
		if again := do(t, "POST", base+"/v1/orders", "k1", order(sku, "ann", 1)); again.status != 201 || again.body != first.body || !again.replayed {
			t.Errorf("duplicate: %d %s replayed=%v, want the first response replayed", again.status, again.body, again.replayed)
		}
		// The same key from another principal is another order: no replay
		// across users. Here it finds the item sold out.
		if other := do(t, "POST", base+"/v1/orders", "k1", order(sku, "bob", 1)); other.replayed || other.code != "sold_out" || other.status != 409 {
			t.Errorf("same key, other user: %d %s replayed=%v", other.status, other.body, other.replayed)
		}
		soldOut := do(t, "POST", base+"/v1/orders", "k2", order(sku, "cat", 1))
		if soldOut.status != 409 || soldOut.code != "sold_out" {
			t.Fatalf("sold out: %d %s", soldOut.status, soldOut.body)
		}
		do(t, "PUT", base+"/v1/items/"+sku, "", `{"stock":5}`)
		// A retry of the sold-out order after the restock still says sold
		// out: the answer was final and is replayed.
		if retry := do(t, "POST", base+"/v1/orders", "k2", order(sku, "cat", 1)); retry.status != 409 || !retry.replayed || retry.body != soldOut.body {
			t.Errorf("retry after restock: %d %s replayed=%v, want the sold_out replayed", retry.status, retry.body, retry.replayed)
		}
		if fresh := do(t, "POST", base+"/v1/orders", "k3", order(sku, "cat", 2)); fresh.status != 201 {
			t.Errorf("new key after restock: %d %s", fresh.status, fresh.body)
		}
		if r := do(t, "GET", base+"/v1/items/"+sku, "", ""); r.body != fmt.Sprintf(`{"sku":%q,"stock":3,"sold":2}`+"\n", sku) {
			t.Errorf("GET item: %d %s", r.status, r.body)
		}
		var o inventory.Order
		r := do(t, "GET", base+"/v1/orders/"+first.orderID, "", "")
		if err := json.Unmarshal([]byte(r.body), &o); err != nil || o.OrderID != first.orderID || o.User != "ann" || o.Qty != 1 || o.Fence == 0 {
			t.Errorf("GET order: %d %s", r.status, r.body)
		}

		for name, tc := range map[string]struct {
			method, path, key, body string
			status                  int
			code                    string
		}{
			"unknown sku":    {"POST", "/v1/orders", "k4", order("nope", "ann", 1), 404, "unknown_sku"},
			"bad body":       {"POST", "/v1/orders", "k5", `{"sku":`, 400, "invalid_request"},
			"unknown field":  {"POST", "/v1/orders", "k6", `{"sku":"a","qty":1,"user":"u","price":1}`, 400, "invalid_request"},
			"zero qty":       {"POST", "/v1/orders", "k7", order(sku, "ann", 0), 400, "invalid_request"},
			"bad user":       {"POST", "/v1/orders", "k8", order(sku, "a b", 1), 400, "invalid_request"},
			"no key":         {"POST", "/v1/orders", "", order(sku, "ann", 1), 400, "idempotency_key_missing"},
			"negative stock": {"PUT", "/v1/items/" + sku, "", `{"stock":-1}`, 400, "invalid_request"},
			"no stock":       {"PUT", "/v1/items/" + sku, "", `{}`, 400, "invalid_request"},
			"bad sku":        {"GET", "/v1/items/a%20b", "", "", 400, "invalid_request"},
			"unknown order":  {"GET", "/v1/orders/o-nope", "", "", 404, "unknown_order"},
			"no route":       {"GET", "/v2/x", "", "", 404, "not_found"},
		} {
			if r := do(t, tc.method, base+tc.path, tc.key, tc.body); r.status != tc.status || r.code != tc.code {
				t.Errorf("%s: %d %s, want %d %s", name, r.status, r.body, tc.status, tc.code)
			}
		}
		if r := do(t, "GET", base+"/healthz", "", ""); r.status != 200 {
			t.Errorf("healthz: %d %s", r.status, r.body)
		}
		if r := do(t, "GET", base+"/metrics", "", ""); r.status != 200 {
			t.Errorf("metrics: %d", r.status)
		}
	})
}

func TestGRPCAPI(t *testing.T) {
	eachStore(t, func(t *testing.T, url string) {
		svc := open(t, url)
		r, err := inventory.Start(svc, "127.0.0.1:0", "127.0.0.1:0", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Stop()
		conn, err := grpc.NewClient(r.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithChainUnaryInterceptor(grpcmw.UnaryClientInterceptor()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		c := inventorypb.NewInventoryClient(conn)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		sku := fmt.Sprintf("tv-%d", time.Now().UnixNano()%1e6)
		if _, err := c.PutItem(ctx, &inventorypb.PutItemRequest{Sku: sku, Stock: 1}); err != nil {
			t.Fatal(err)
		}
		call := func(key, user string) (*inventorypb.Order, metadata.MD, error) {
			var md metadata.MD
			cctx := metadata.AppendToOutgoingContext(ctx, grpcmw.DefaultMetadataKey, runID+"-"+key, inventory.UserMetadataKey, user)
			o, err := c.PlaceOrder(cctx, &inventorypb.PlaceOrderRequest{Sku: sku, Qty: 1, User: user}, grpc.Header(&md))
			return o, md, err
		}
		o1, _, err := call("g1", "ann")
		if err != nil || o1.GetFence() == 0 {
			t.Fatalf("PlaceOrder: %v %v", o1, err)
		}
		o2, md, err := call("g1", "ann")
		if err != nil || o2.GetOrderId() != o1.GetOrderId() || md.Get(grpcmw.ReplayedMetadataKey)[0] != "true" {
			t.Errorf("duplicate: %v %v %v", o2, md, err)
		}
		_, _, err = call("g2", "bob")
		if st := status.Convert(err); st.Code() != codes.FailedPrecondition {
			t.Fatalf("sold out: %v", err)
		}
		if _, err := c.PutItem(ctx, &inventorypb.PutItemRequest{Sku: sku, Stock: 3}); err != nil {
			t.Fatal(err)
		}
		_, md, err = call("g2", "bob")
		if st := status.Convert(err); st.Code() != codes.FailedPrecondition || len(md.Get(grpcmw.ReplayedMetadataKey)) == 0 {
			t.Errorf("retry after restock: %v (header %v), want the sold_out replayed", err, md)
		}
		if _, err := c.GetOrder(ctx, &inventorypb.GetOrderRequest{OrderId: o1.GetOrderId()}); err != nil {
			t.Error(err)
		}
		if _, err := c.GetItem(ctx, &inventorypb.GetItemRequest{Sku: "nope"}); status.Code(err) != codes.NotFound {
			t.Errorf("unknown sku: %v", err)
		}
		annCtx := metadata.AppendToOutgoingContext(ctx, inventory.UserMetadataKey, "ann")
		if _, err := c.PlaceOrder(annCtx, &inventorypb.PlaceOrderRequest{Sku: sku, Qty: 0, User: "ann"}); status.Code(err) != codes.InvalidArgument {
			t.Errorf("qty 0: %v", err)
		}
		if _, err := c.PlaceOrder(ctx, &inventorypb.PlaceOrderRequest{Sku: sku, Qty: 1, User: "ann"}); status.Code(err) != codes.Unauthenticated {
			t.Errorf("an order without its caller: %v, want Unauthenticated", err)
		}
	})
}

// Hold, then pay: a hold keeps its units from other buyers, paying it is
// one order however often it is paid, a released hold's units are for
// sale again, and so are an unpaid hold's once it runs out.
func TestHoldThenPay(t *testing.T) {
	eachStore(t, func(t *testing.T, url string) {
		base := serveHTTP(t, open(t, url))
		sku := fmt.Sprintf("seat-%d", time.Now().UnixNano()%1e6)
		hold := func(key string, ttl time.Duration) (response, string) {
			r := do(t, "POST", base+"/v1/holds", key, fmt.Sprintf(`{"sku":%q,"qty":1,"user":"ann","ttl_ms":%d}`, sku, ttl.Milliseconds()))
			var h inventory.Hold
			_ = json.Unmarshal([]byte(r.body), &h)
			return r, h.HoldID
		}
		item := func() string { return do(t, "GET", base+"/v1/items/"+sku, "", "").body }
		do(t, "PUT", base+"/v1/items/"+sku, "", `{"stock":2}`)
		r, h1 := hold("h1", time.Minute)
		if r.status != 201 || h1 == "" {
			t.Fatalf("hold: %d %s", r.status, r.body)
		}
		if again, _ := hold("h1", time.Minute); again.body != r.body || !again.replayed {
			t.Errorf("the hold retried: %d %s, want the first answer replayed", again.status, again.body)
		}
		if got := item(); got != fmt.Sprintf(`{"sku":%q,"stock":1,"sold":0,"held":1}`+"\n", sku) {
			t.Errorf("item while held: %s", got)
		}
		pay := func(key, id string) response {
			return do(t, "POST", base+"/v1/holds/"+id+"/pay", key, `{"user":"ann"}`)
		}
		paid := pay("p1", h1)
		if paid.status != 201 || paid.orderID == "" {
			t.Fatalf("pay: %d %s", paid.status, paid.body)
		}
		if twice := pay("p2", h1); twice.status != 201 || twice.orderID != paid.orderID {
			t.Errorf("paid again with another key: %d %s, want the same order", twice.status, twice.body)
		}
		if r := do(t, "DELETE", base+"/v1/holds/"+h1, "", ""); r.status != 409 || r.code != "hold_paid" {
			t.Errorf("release of a paid hold: %d %s", r.status, r.body)
		}
		_, h2 := hold("h2", time.Minute)
		if r := do(t, "POST", base+"/v1/orders", "o1", order(sku, "bob", 1)); r.code != "sold_out" {
			t.Errorf("an order while the last unit is held: %d %s, want sold_out", r.status, r.body)
		}
		if r := do(t, "DELETE", base+"/v1/holds/"+h2, "", ""); r.status != 204 {
			t.Errorf("release: %d %s", r.status, r.body)
		}
		_, h3 := hold("h3", time.Second)
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			// Hold's end is what is tested: etcd ends it with its lease,
			// rounded up to whole seconds, at least its minimum TTL.
			if got := item(); got == fmt.Sprintf(`{"sku":%q,"stock":1,"sold":1}`+"\n", sku) {
				break
			} else if time.Now().After(deadline) {
				t.Fatalf("an unpaid hold's unit did not come back: %s", got)
			}
		}
		if r := pay("p3", h3); r.status != 409 || r.code != "hold_expired" {
			t.Errorf("pay after the hold ran out: %d %s", r.status, r.body)
		}
		if orders, err := http.Get(base + "/v1/stats"); err == nil {
			var st inventory.Stats
			_ = json.NewDecoder(orders.Body).Decode(&st)
			orders.Body.Close()
			if st.Orders != 1 {
				t.Errorf("%d orders, want 1 (the paid hold)", st.Orders)
			}
		}
	})
}

// A replica that dies between a sale's take and its record: the client's
// retry (the same order) takes nothing more and records the order once.
func TestSaleSurvivesACrashBeforeItsRecord(t *testing.T) {
	eachStore(t, func(t *testing.T, url string) {
		store, backend, closeStore, err := inventory.Open(url, fmt.Sprintf("inv-crash:%d:", time.Now().UnixNano()), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer closeStore()
		ctx := context.Background()
		if _, err := backend.PutItem(ctx, "sku", 10); err != nil {
			t.Fatal(err)
		}
		g, err := idem.NewGuard(store)
		if err != nil {
			t.Fatal(err)
		}
		// Placed with the SKU, as the service places orders: on Redis
		// Cluster the order commits in the record's slot.
		key, _ := idem.Placed("sku", fmt.Sprintf("crash-%d", time.Now().UnixNano()))
		o := inventory.Order{OrderID: inventory.OrderID(key, "sku"), SKU: "sku", Qty: 2, User: "u"}
		crash := errors.New("the replica died")
		run := func(crashed bool) ([]byte, bool, error) {
			return g.Do(ctx, key, "fp", func(ctx context.Context) ([]byte, error) {
				if err := backend.Take(ctx, o); err != nil {
					return nil, err
				}
				if crashed {
					return nil, crash // after the take, before the order's record
				}
				effect, err := backend.Record(ctx, o)
				if err != nil || effect == nil {
					return nil, err // Redlock records at once, keyed on the order
				}
				return nil, idem.Commit(ctx, effect)
			})
		}
		if _, _, err := run(true); !errors.Is(err, crash) {
			t.Fatalf("the first run: %v", err)
		}
		if _, _, err := run(false); err != nil {
			t.Fatalf("the retry: %v", err)
		}
		if it, err := backend.Item(ctx, "sku"); err != nil || it.Stock != 8 || it.Sold != 2 {
			t.Errorf("after the crash and the retry: %+v, %v; want 2 sold once", it, err)
		}
		if got, err := backend.Order(ctx, o.OrderID); err != nil || got.Qty != 2 {
			t.Errorf("the order: %+v, %v", got, err)
		}
		if orders, _, err := backend.Counts(ctx); err != nil || orders != 1 {
			t.Errorf("%d orders, %v; want 1", orders, err)
		}
	})
}

// A flash sale against two in-process replicas: nothing oversold, no order
// run twice, every replay identical — with the SKU lock, and without it.
func TestFlashSale(t *testing.T) {
	eachStore(t, func(t *testing.T, url string) {
		flashSale(t, open(t, url))
	})
	for _, name := range []string{"memory", "redis", "redis-cluster", "redlock", "etcd", "postgres", "postgres-pgbouncer", "mysql", "zk"} {
		t.Run(name+"/lock-free", func(t *testing.T) { flashSale(t, openLockFree(t, stores[name](t))) })
	}
}

// A flash sale as a new user tries it: one replica, HTTP only, 200 buyers
// at once with distinct keys for 8 units, under the SKU lock. Every answer
// is a sale (201) or sold_out (409): none may refuse a live holder's sale
// (effect_refused, stale_fence), on every store and every Redis
// deployment (one server, Sentinel, Cluster).
func TestFlashSaleEveryAnswerASale(t *testing.T) {
	for _, name := range []string{"memory", "redis", "redis-sentinel", "redis-cluster", "redlock", "etcd", "postgres", "postgres-pgbouncer", "mysql", "zk"} {
		t.Run(name, func(t *testing.T) {
			svc := open(t, stores[name](t))
			r, err := inventory.Start(svc, "127.0.0.1:0", "127.0.0.1:0", nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(r.Stop)
			rep, err := flashsale.Run(context.Background(), flashsale.Config{Targets: []string{"http://" + r.HTTPAddr},
				Buyers: 200, Stock: 8, DupRate: -1})
			if err != nil {
				t.Fatal(err)
			}
			if !rep.OK() || rep.Sold != 8 || rep.Confirmed != 8 || rep.SoldOut != 192 || rep.Refused != 0 {
				var out strings.Builder
				rep.Print(&out)
				t.Errorf("report:\n%s", out.String())
			}
		})
	}
}

func openLockFree(t *testing.T, url string) *inventory.Service {
	t.Helper()
	store, backend, closeStore, err := inventory.Open(url, fmt.Sprintf("inv-test:%d:", time.Now().UnixNano()), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(closeStore)
	svc, err := inventory.New(inventory.Config{Store: store, Backend: backend, LockFree: true})
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

func flashSale(t *testing.T, svc *inventory.Service) {
	{
		var targets, grpcs []string
		for range 2 {
			r, err := inventory.Start(svc, "127.0.0.1:0", "127.0.0.1:0", nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(r.Stop)
			targets = append(targets, "http://"+r.HTTPAddr)
			grpcs = append(grpcs, r.GRPCAddr)
		}
		rep, err := flashsale.Run(context.Background(), flashsale.Config{Targets: targets, GRPC: grpcs, Buyers: 120, Stock: 40, DupRate: 0.5})
		if err != nil {
			t.Fatal(err)
		}
		var out strings.Builder
		rep.Print(&out)
		if !rep.OK() || rep.Sold != 40 || rep.Replays == 0 {
			t.Errorf("report:\n%s", out.String())
		}
		var html strings.Builder
		if err := rep.WriteHTML(&html); err != nil || !strings.Contains(html.String(), "<svg") {
			t.Errorf("HTML report: %v", err)
		}
	}
}

// The replica serves grpc.health.v1 (SERVING while its store answers;
// integration's TestHealthFollowsTheStore stops the store) and gRPC
// reflection, both without an idempotency key.
func TestHealthAndReflection(t *testing.T) {
	svc := open(t, "memory://")
	r, err := inventory.Start(svc, "127.0.0.1:0", "127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	conn, err := grpc.NewClient(r.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	health := healthpb.NewHealthClient(conn)
	check := func(service string) (healthpb.HealthCheckResponse_ServingStatus, error) {
		resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{Service: service})
		return resp.GetStatus(), err
	}
	for _, service := range []string{"", "oncekit.inventory.v1.Inventory"} {
		if st, err := check(service); err != nil || st != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("Check(%q): %v %v, want SERVING", service, st, err)
		}
	}
	if _, err := check("nope"); status.Code(err) != codes.NotFound {
		t.Errorf("Check of an unknown service: %v, want NotFound", err)
	}

	stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var services []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		services = append(services, s.GetName())
	}
	if !slices.Contains(services, "oncekit.inventory.v1.Inventory") {
		t.Errorf("reflection lists %q", services)
	}
	_ = stream.CloseSend()
}

// One trace follows an order: the HTTP request that sells it (its
// http.request span), the order.created message the outbox relay sends
// later (its headers carry the request's trace context, kept with the
// order in the outbox), and the shipping consumer's "process" span.
func TestOrderTraceThroughKafka(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	prevProp := otel.GetTextMapPropagator()
	otel.SetTextMapPropagator(propagation.TraceContext{})
	t.Cleanup(func() { otel.SetTextMapPropagator(prevProp) })

	brokers := kafkamwtest.Brokers(t)
	topic := kafkamwtest.Topic(t, brokers, 1)
	store, backend, closeStore, err := inventory.Open("memory://", "trace:", otelobs.New(otelobs.WithTracerProvider(tp)))
	if err != nil {
		t.Fatal(err)
	}
	defer closeStore()
	svc, err := inventory.New(inventory.Config{Store: store, Backend: backend})
	if err != nil {
		t.Fatal(err)
	}
	r, err := inventory.Start(svc, "127.0.0.1:0", "127.0.0.1:0", &inventory.Kafka{Brokers: brokers, Topic: topic, Group: "shipping-" + topic})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	base := "http://" + r.HTTPAddr
	if resp := do(t, "PUT", base+"/v1/items/tv-1", "", `{"stock":1}`); resp.status != 200 {
		t.Fatalf("PUT item: %d %s", resp.status, resp.body)
	}
	if resp := do(t, "POST", base+"/v1/orders", "trace-1", order("tv-1", "ann", 1)); resp.status != 201 || strings.Contains(resp.body, "trace") {
		t.Fatalf("POST order: %d %s", resp.status, resp.body)
	}
	var process, request []sdktrace.ReadOnlySpan
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		process, request = nil, nil
		for _, s := range rec.Ended() {
			switch s.Name() {
			case "process " + topic:
				process = append(process, s)
			case "http.request":
				request = append(request, s)
			}
		}
		if len(process) > 0 {
			break
		}
	}
	if len(request) != 1 || len(process) != 1 {
		t.Fatalf("%d http.request and %d process spans, want 1 and 1", len(request), len(process))
	}
	if got, want := process[0].SpanContext().TraceID(), request[0].SpanContext().TraceID(); got != want {
		t.Errorf("the shipping consumer's span is in trace %s, the request's is %s", got, want)
	}
}
