package grpcmw_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/retry"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/observe"
	"github.com/oncekit/oncekit/grpcmw"
	"github.com/oncekit/oncekit/grpcmw/internal/testpb"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/storage/memstore"
	"github.com/oncekit/oncekit/storage/redisstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// orders is the test service: Place counts its runs and answers with the
// run number and its claim's fence, unless place says otherwise.
type orders struct {
	testpb.UnimplementedOrdersServer
	runs   atomic.Int64
	place  func(ctx context.Context, req *testpb.PlaceRequest, run int64) (*testpb.PlaceReply, error)
	follow func(testpb.Orders_FollowServer) error
}

func (o *orders) Place(ctx context.Context, req *testpb.PlaceRequest) (*testpb.PlaceReply, error) {
	n := o.runs.Add(1)
	if o.place != nil {
		return o.place(ctx, req, n)
	}
	f, _ := idem.FenceFrom(ctx)
	return &testpb.PlaceReply{OrderId: fmt.Sprintf("order-%d", n), Run: n, Fence: f}, nil
}

func (o *orders) Follow(s testpb.Orders_FollowServer) error {
	if o.follow != nil {
		return o.follow(s)
	}
	return nil
}

var stores = []struct {
	name string
	new  func(t *testing.T) idemdriver.Store
}{
	{"memory", func(*testing.T) idemdriver.Store { return memstore.New() }},
	{"redis", func(t *testing.T) idemdriver.Store {
		c := redis.NewClient(&redis.Options{Addr: testenv.RedisAddrs(t, 1)[0]})
		t.Cleanup(func() { c.Close() })
		s, err := redisstore.New(c, redisstore.WithRecordPrefix(fmt.Sprintf("grpcmw-test:%d:", time.Now().UnixNano())))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}},
}

func eachStore(t *testing.T, f func(t *testing.T, st idemdriver.Store)) {
	for _, s := range stores {
		t.Run(s.name, func(t *testing.T) { f(t, s.new(t)) })
	}
}

// serve runs o behind the interceptors on a loopback listener and returns
// a client.
func serve(t *testing.T, st idemdriver.Store, o *orders, gopts []idem.Option, opts []grpcmw.Option, dial ...grpc.DialOption) testpb.OrdersClient {
	t.Helper()
	g, err := idem.NewGuard(st, gopts...)
	if err != nil {
		t.Fatal(err)
	}
	opts = append([]grpcmw.Option{grpcmw.Unscoped()}, opts...)
	unary, err := grpcmw.UnaryServerInterceptor(g, opts...)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := grpcmw.StreamServerInterceptor(g, opts...)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(unary), grpc.ChainStreamInterceptor(stream))
	testpb.RegisterOrdersServer(srv, o)
	return listen(t, srv, dial...)
}

// listen serves srv on a loopback listener until the test ends and returns
// a client of it.
func listen(tb testing.TB, srv *grpc.Server, dial ...grpc.DialOption) testpb.OrdersClient {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	tb.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, dial...)...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { conn.Close() })
	return testpb.NewOrdersClient(conn)
}

func withKey(ctx context.Context, key string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, grpcmw.DefaultMetadataKey, key)
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// A duplicate runs once and gets an equal reply, marked as replayed.
func TestDuplicateRunsOnce(t *testing.T) {
	eachStore(t, func(t *testing.T, st idemdriver.Store) {
		o := &orders{}
		c := serve(t, st, o, nil, nil)
		req := &testpb.PlaceRequest{Sku: "phone", Qty: 1, User: "alice"}
		var replies []*testpb.PlaceReply
		for i := range 3 {
			var hdr metadata.MD
			r, err := c.Place(withKey(ctxT(t, 5*time.Second), "k-1"), req, grpc.Header(&hdr))
			if err != nil {
				t.Fatalf("call %d: %v", i, err)
			}
			if replayed := len(hdr.Get(grpcmw.ReplayedMetadataKey)) > 0; replayed != (i > 0) {
				t.Errorf("call %d: replayed header %v", i, hdr.Get(grpcmw.ReplayedMetadataKey))
			}
			replies = append(replies, r)
		}
		if !proto.Equal(replies[0], replies[1]) || !proto.Equal(replies[0], replies[2]) || replies[0].Fence == 0 {
			t.Errorf("replies %v; want three equal replies with a fence", replies)
		}
		if n := o.runs.Load(); n != 1 {
			t.Errorf("handler ran %d times", n)
		}
	})
}

// 100 concurrent duplicates: one run, every caller gets its reply.
func TestConcurrentDuplicates(t *testing.T) {
	eachStore(t, func(t *testing.T, st idemdriver.Store) {
		o := &orders{place: func(ctx context.Context, req *testpb.PlaceRequest, n int64) (*testpb.PlaceReply, error) {
			time.Sleep(50 * time.Millisecond)
			return &testpb.PlaceReply{OrderId: "order", Run: n}, nil
		}}
		c := serve(t, st, o, nil, []grpcmw.Option{grpcmw.WithWait(10 * time.Second)})
		var wg sync.WaitGroup
		var bad atomic.Int64
		for range 100 {
			wg.Go(func() {
				r, err := c.Place(withKey(ctxT(t, 20*time.Second), "k-many"), &testpb.PlaceRequest{Sku: "phone"})
				if err != nil || r.Run != 1 {
					bad.Add(1)
				}
			})
		}
		wg.Wait()
		if n := o.runs.Load(); n != 1 || bad.Load() != 0 {
			t.Errorf("%d runs, %d callers without the one reply", n, bad.Load())
		}
	})
}

func TestKeysAndMismatch(t *testing.T) {
	o := &orders{}
	c := serve(t, memstore.New(), o, nil, nil)
	ctx := ctxT(t, 5*time.Second)
	if _, err := c.Place(ctx, &testpb.PlaceRequest{}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("no key: %v, want InvalidArgument", err)
	}
	if _, err := c.Place(withKey(ctx, "bad key"), &testpb.PlaceRequest{}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("a key with a space: %v, want InvalidArgument", err)
	}
	if _, err := c.Place(withKey(ctx, "k-m"), &testpb.PlaceRequest{Sku: "a"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Place(withKey(ctx, "k-m"), &testpb.PlaceRequest{Sku: "b"}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("same key, other request: %v, want FailedPrecondition", err)
	}
	// The key from the request (AIP-155), and an optional key.
	o2 := &orders{}
	c2 := serve(t, memstore.New(), o2, nil, []grpcmw.Option{grpcmw.WithOptionalKey(), grpcmw.WithKeyExtractor(grpcmw.RequestIDField("request_id"))})
	for range 2 {
		if _, err := c2.Place(ctx, &testpb.PlaceRequest{RequestId: "req-1"}); err != nil {
			t.Fatal(err)
		}
		if _, err := c2.Place(ctx, &testpb.PlaceRequest{}); err != nil { // no key: passed through
			t.Fatal(err)
		}
	}
	if n := o2.runs.Load(); n != 3 {
		t.Errorf("%d runs; want 1 for the request_id and 2 without a key", n)
	}
	for _, name := range []string{"no_such_field", "qty"} { // absent, not a string
		if k, ok := grpcmw.RequestIDField(name)(ctx, &testpb.PlaceRequest{Qty: 3, RequestId: "r"}); ok {
			t.Errorf("RequestIDField(%q) found %q", name, k)
		}
	}
}

// Final errors are stored and replayed with their status details; others
// let a retry run.
func TestStoredErrorsReplayedWithDetails(t *testing.T) {
	eachStore(t, func(t *testing.T, st idemdriver.Store) {
		var attempts []int
		o := &orders{place: func(ctx context.Context, req *testpb.PlaceRequest, n int64) (*testpb.PlaceReply, error) {
			if req.Sku == "flaky" {
				a, _ := idem.AttemptFrom(ctx)
				attempts = append(attempts, a)
				return nil, status.Error(codes.Unavailable, "try again")
			}
			s, _ := status.New(codes.InvalidArgument, "qty must be positive").WithDetails(&errdetails.BadRequest{
				FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "qty", Description: "must be positive"}}})
			return nil, s.Err()
		}}
		c := serve(t, st, o, nil, nil)
		ctx := ctxT(t, 5*time.Second)
		for i := range 2 {
			_, err := c.Place(withKey(ctx, "k-bad"), &testpb.PlaceRequest{Qty: -1})
			s := status.Convert(err)
			if s.Code() != codes.InvalidArgument || len(s.Details()) != 1 {
				t.Fatalf("call %d: %v %v; want InvalidArgument with a BadRequest detail", i, s.Code(), s.Details())
			}
			if br, ok := s.Details()[0].(*errdetails.BadRequest); !ok || br.FieldViolations[0].Field != "qty" {
				t.Errorf("call %d: detail %v", i, s.Details()[0])
			}
		}
		if n := o.runs.Load(); n != 1 {
			t.Errorf("a final error ran %d times, want 1", n)
		}
		for range 2 {
			if _, err := c.Place(withKey(ctx, "k-flaky"), &testpb.PlaceRequest{Sku: "flaky"}); status.Code(err) != codes.Unavailable {
				t.Fatalf("flaky: %v", err)
			}
		}
		if n := o.runs.Load(); n != 3 {
			t.Errorf("%d runs; an Unavailable error must let the retry run", n)
		}
		if !slices.Equal(attempts, []int{1, 2}) {
			t.Errorf("the flaky handler saw attempts %v, want [1 2] (the retry knows it is one)", attempts)
		}
	})
}

// A client that times out and retries while its first call still runs
// never gets a second concurrent run: the claim lives until the handler
// returns.
func TestClientTimeoutThenRetry(t *testing.T) {
	eachStore(t, func(t *testing.T, st idemdriver.Store) {
		var running, overlaps atomic.Int32
		release := make(chan struct{})
		o := &orders{place: func(context.Context, *testpb.PlaceRequest, int64) (*testpb.PlaceReply, error) {
			if running.Add(1) > 1 {
				overlaps.Add(1)
			}
			defer running.Add(-1)
			// Ignores the client's deadline, and runs past several TTLs:
			// until the test has retried (a loaded machine's sleep could
			// otherwise outlast a fixed run time).
			select {
			case <-release:
			case <-time.After(10 * time.Second):
			}
			return &testpb.PlaceReply{OrderId: "slow"}, nil
		}}
		c := serve(t, st, o, []idem.Option{idem.WithTTL(300 * time.Millisecond)}, nil)
		short, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		_, err := c.Place(withKey(short, "k-slow"), &testpb.PlaceRequest{})
		cancel()
		if status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("first call: %v, want its deadline", err)
		}
		time.Sleep(500 * time.Millisecond) // the claim outlives its 300 ms TTL
		if _, err := c.Place(withKey(ctxT(t, 5*time.Second), "k-slow"), &testpb.PlaceRequest{}); status.Code(err) != codes.Aborted {
			t.Errorf("retry while the first call runs: %v, want Aborted", err)
		}
		close(release)
		var r *testpb.PlaceReply
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			r, err = c.Place(withKey(ctxT(t, 5*time.Second), "k-slow"), &testpb.PlaceRequest{})
			if status.Code(err) != codes.Aborted || time.Now().After(deadline) {
				break // (Aborted until the first call has stored its reply)
			}
		}
		if err != nil || r.OrderId != "slow" {
			t.Errorf("retry after the first call: %v %v; want its reply", r, err)
		}
		if o.runs.Load() != 1 || overlaps.Load() != 0 {
			t.Errorf("%d runs, %d overlapping", o.runs.Load(), overlaps.Load())
		}
	})
}

// The client interceptor mints one key per logical call and gRPC's own
// retries (a service-config retry policy) carry it: the server sees the
// same key on both attempts, and the failed first attempt, not stored,
// lets the second run.
func TestClientKeepsKeyAcrossRetries(t *testing.T) {
	var (
		mu   sync.Mutex
		keys []string
	)
	o := &orders{place: func(ctx context.Context, _ *testpb.PlaceRequest, n int64) (*testpb.PlaceReply, error) {
		k, _ := idem.KeyFrom(ctx)
		mu.Lock()
		keys = append(keys, k)
		mu.Unlock()
		if n == 1 {
			return nil, status.Error(codes.Unavailable, "first attempt fails")
		}
		return &testpb.PlaceReply{OrderId: "ok", Run: n}, nil
	}}
	const retry = `{"methodConfig":[{"name":[{"service":"oncekit.grpcmw.test.Orders"}],
		"retryPolicy":{"maxAttempts":3,"initialBackoff":"0.01s","maxBackoff":"0.05s","backoffMultiplier":2,
		"retryableStatusCodes":["UNAVAILABLE"]}}]}`
	c := serve(t, memstore.New(), o, nil, nil,
		grpc.WithDefaultServiceConfig(retry), grpc.WithChainUnaryInterceptor(grpcmw.UnaryClientInterceptor()))
	r, err := c.Place(ctxT(t, 5*time.Second), &testpb.PlaceRequest{Sku: "phone"})
	if err != nil || r.OrderId != "ok" {
		t.Fatalf("Place with a retry policy: %v %v", r, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(keys) != 2 || keys[0] == "" || keys[0] != keys[1] {
		t.Errorf("stored keys of the attempts %q; want two equal keys", keys)
	}
}

// One stream per key at a time; the next runs once the first ends.
func TestStreamOneAtATime(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	o := &orders{follow: func(s testpb.Orders_FollowServer) error {
		started <- struct{}{}
		<-release
		return s.Send(&testpb.PlaceReply{OrderId: "followed"})
	}}
	c := serve(t, memstore.New(), o, nil, nil)
	ctx := ctxT(t, 10*time.Second)
	first, err := c.Follow(withKey(ctx, "k-stream"))
	if err != nil {
		t.Fatal(err)
	}
	<-started
	second, err := c.Follow(withKey(ctx, "k-stream"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := second.Recv(); status.Code(err) != codes.Aborted {
		t.Errorf("a second stream with a running stream's key: %v, want Aborted", err)
	}
	close(release)
	if r, err := first.Recv(); err != nil || r.OrderId != "followed" {
		t.Fatalf("first stream: %v %v", r, err)
	}
	if _, err := first.Recv(); err == nil {
		t.Fatal("first stream did not end")
	}
	third, err := c.Follow(withKey(ctx, "k-stream"))
	if err != nil {
		t.Fatal(err)
	}
	<-started
	if r, err := third.Recv(); err != nil || r.OrderId != "followed" {
		t.Errorf("a stream after the first ended: %v %v", r, err)
	}
}

func TestNewValidates(t *testing.T) {
	g, err := idem.NewGuard(memstore.New())
	if err != nil {
		t.Fatal(err)
	}
	for name, opts := range map[string][]grpcmw.Option{
		"no scope":        nil,
		"two key spaces":  {grpcmw.Unscoped(), grpcmw.Unscoped()},
		"nil scope":       {grpcmw.WithScope(nil)},
		"empty metadata":  {grpcmw.Unscoped(), grpcmw.WithKeyMetadata("")},
		"negative wait":   {grpcmw.Unscoped(), grpcmw.WithWait(-time.Second)},
		"nil placement":   {grpcmw.Unscoped(), grpcmw.WithPlacement(nil)},
		"nil fingerprint": {grpcmw.Unscoped(), grpcmw.WithFingerprint(nil)},
	} {
		if _, err := grpcmw.UnaryServerInterceptor(g, opts...); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if _, err := grpcmw.UnaryServerInterceptor(nil, grpcmw.Unscoped()); err == nil {
		t.Error("nil Guard: no error")
	}

}

// WithPlacement places a unary call's stored key by its request; a place
// that cannot be one refuses the call with InvalidArgument, nothing run.
func TestPlacement(t *testing.T) {
	var keys []string
	o := &orders{place: func(ctx context.Context, req *testpb.PlaceRequest, run int64) (*testpb.PlaceReply, error) {
		k, _ := idem.KeyFrom(ctx)
		keys = append(keys, k)
		return &testpb.PlaceReply{Run: run}, nil
	}}
	client := serve(t, memstore.New(), o, nil, []grpcmw.Option{grpcmw.WithPlacement(func(_ context.Context, req any) string {
		return req.(*testpb.PlaceRequest).GetSku()
	})})
	ctx := ctxT(t, 10*time.Second)
	if _, err := client.Place(withKey(ctx, "k1"), &testpb.PlaceRequest{Sku: "tv-1", Qty: 1, User: "u"}); err != nil {
		t.Fatal(err)
	}
	if len(keys) != 1 {
		t.Fatalf("%d runs", len(keys))
	}
	if p, ok := idemdriver.PlaceOf(keys[0]); !ok || p != "tv-1" {
		t.Errorf("stored key %q, want it placed in tv-1", keys[0])
	}
	_, err := client.Place(withKey(ctx, "k2"), &testpb.PlaceRequest{Sku: "a{b", Qty: 1, User: "u"})
	if status.Code(err) != codes.InvalidArgument || len(keys) != 1 {
		t.Errorf("a place with a brace: %v, %d runs; want InvalidArgument and none", err, len(keys))
	}
}

// WithFingerprint decides what makes two calls the same: here the user is
// left out, so a retry that changes it is replayed; the SKU is kept, so a
// retry that changes it is FailedPrecondition. A fingerprint error refuses
// the call with InvalidArgument, nothing run.
func TestFingerprint(t *testing.T) {
	o := &orders{}
	client := serve(t, memstore.New(), o, nil, []grpcmw.Option{grpcmw.WithFingerprint(func(m string, req proto.Message) (string, error) {
		r := req.(*testpb.PlaceRequest)
		if r.GetQty() < 0 {
			return "", errors.New("negative qty")
		}
		return idem.Fingerprint([]byte(m), []byte(r.GetSku()), []byte(strconv.FormatInt(int64(r.GetQty()), 10))), nil
	})})
	ctx := ctxT(t, 10*time.Second)
	if _, err := client.Place(withKey(ctx, "f1"), &testpb.PlaceRequest{Sku: "tv-1", Qty: 1, User: "a"}); err != nil {
		t.Fatal(err)
	}
	var header metadata.MD
	if _, err := client.Place(withKey(ctx, "f1"), &testpb.PlaceRequest{Sku: "tv-1", Qty: 1, User: "b"}, grpc.Header(&header)); err != nil || o.runs.Load() != 1 {
		t.Errorf("a retry differing in a field left out: %v, %d runs; want a replay", err, o.runs.Load())
	}
	if _, err := client.Place(withKey(ctx, "f1"), &testpb.PlaceRequest{Sku: "tv-2", Qty: 1, User: "a"}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("another SKU under the key: %v, want FailedPrecondition", err)
	}
	if _, err := client.Place(withKey(ctx, "f2"), &testpb.PlaceRequest{Sku: "tv-1", Qty: -1, User: "a"}); status.Code(err) != codes.InvalidArgument || o.runs.Load() != 1 {
		t.Errorf("a fingerprint error: %v, %d runs; want InvalidArgument and none", err, o.runs.Load())
	}
}

// Health checks and reflection pass through without a key by default, so
// that Kubernetes probes and grpcurl work; a WithSelector replaces that
// default. A scope function that returns "" refuses the call (Internal),
// with nothing run.
func TestDefaultsThatCannotHurt(t *testing.T) {
	st := memstore.New()
	g, err := idem.NewGuard(st)
	if err != nil {
		t.Fatal(err)
	}
	unary, err := grpcmw.UnaryServerInterceptor(g, grpcmw.WithScope(func(ctx context.Context) string {
		md, _ := metadata.FromIncomingContext(ctx)
		if u := md.Get("x-user"); len(u) > 0 {
			return u[0]
		}
		return ""
	}))
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(unary))
	o := &orders{}
	testpb.RegisterOrdersServer(srv, o)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	client := listen(t, srv)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv2 := grpc.NewServer(grpc.ChainUnaryInterceptor(unary))
	healthpb.RegisterHealthServer(srv2, hs)
	go func() { _ = srv2.Serve(ln) }()
	defer srv2.Stop()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx := ctxT(t, 10*time.Second)
	if resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("a health check without a key: %v %v, want SERVING", resp, err)
	}
	_, err = client.Place(withKey(ctx, "anon-1"), &testpb.PlaceRequest{Sku: "x", Qty: 1, User: "u"})
	if status.Code(err) != codes.Internal || o.runs.Load() != 0 {
		t.Errorf("a call whose scope is empty: %v, %d runs; want Internal and none", err, o.runs.Load())
	}
	cctx := metadata.AppendToOutgoingContext(withKey(ctx, "alice-1"), "x-user", "alice")
	if _, err := client.Place(cctx, &testpb.PlaceRequest{Sku: "x", Qty: 1, User: "u"}); err != nil || o.runs.Load() != 1 {
		t.Errorf("a scoped call: %v, %d runs", err, o.runs.Load())
	}
}

// Each unary call under the interceptor is one OpCall event,
// with the method as its route and how it ended: what promobs and otelobs
// turn into gRPC metrics and spans.
func TestCallsReported(t *testing.T) {
	ev := testenv.NewEvents()
	o := &orders{}
	c := serve(t, memstore.New(), o, []idem.Option{idem.WithObserver(ev)}, nil)
	ctx := ctxT(t, 10*time.Second)
	req := &testpb.PlaceRequest{Sku: "x", Qty: 1, User: "u"}
	for range 2 {
		if _, err := c.Place(withKey(ctx, "obs-1"), req); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Place(ctx, req); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a call without a key: %v", err)
	}
	var got []observe.Outcome
	for _, e := range ev.Of(grpcmw.OpCall) {
		if e.Route != testpb.Orders_Place_FullMethodName {
			t.Errorf("event route %q, want %q", e.Route, testpb.Orders_Place_FullMethodName)
		}
		got = append(got, e.Outcome)
	}
	want := []observe.Outcome{observe.Executed, observe.Replayed, observe.Invalid}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("OpCall outcomes %v, want %v", got, want)
	}
}

// The client interceptor must be outside a retry interceptor: it mints the
// key once per logical call, and the retries inside it resend that key.
// Inside the retry interceptor it would mint a new key per attempt, and a
// server would run every attempt: shown here with go-grpc-middleware's
// retry interceptor against a server that fails the first two attempts.
func TestClientKeyAcrossRetryInterceptor(t *testing.T) {
	for _, outside := range []bool{true, false} {
		t.Run(fmt.Sprintf("grpcmw-outside-retry=%v", outside), func(t *testing.T) {
			var mu sync.Mutex
			var keys []string
			flaky := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
				md, _ := metadata.FromIncomingContext(ctx)
				mu.Lock()
				keys = append(keys, md.Get(grpcmw.DefaultMetadataKey)...)
				n := len(keys)
				mu.Unlock()
				if n <= 2 {
					return nil, status.Error(codes.Unavailable, "try again")
				}
				return handler(ctx, req)
			}
			srv := grpc.NewServer(grpc.ChainUnaryInterceptor(flaky))
			testpb.RegisterOrdersServer(srv, &orders{})
			retrying := retry.UnaryClientInterceptor(retry.WithMax(3), retry.WithCodes(codes.Unavailable),
				retry.WithBackoff(retry.BackoffLinear(time.Millisecond)))
			chain := []grpc.UnaryClientInterceptor{grpcmw.UnaryClientInterceptor(), retrying}
			if !outside {
				chain = []grpc.UnaryClientInterceptor{retrying, grpcmw.UnaryClientInterceptor()}
			}
			c := listen(t, srv, grpc.WithChainUnaryInterceptor(chain...))
			if _, err := c.Place(ctxT(t, 10*time.Second), &testpb.PlaceRequest{Sku: "x", Qty: 1, User: "u"}); err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			defer mu.Unlock()
			distinct := map[string]bool{}
			for _, k := range keys {
				distinct[k] = true
			}
			switch {
			case len(keys) != 3:
				t.Fatalf("%d attempts reached the server, want 3", len(keys))
			case outside && len(distinct) != 1:
				t.Errorf("grpcmw outside the retry interceptor: keys %v, want one key for every attempt", keys)
			case !outside && len(distinct) != 3:
				t.Errorf("grpcmw inside the retry interceptor: keys %v; the test expected a new key per attempt (the wrong order it documents)", keys)
			}
		})
	}
}
