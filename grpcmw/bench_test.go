package grpcmw_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/grpcmw"
	"github.com/oncekit/oncekit/grpcmw/internal/testpb"
	"github.com/oncekit/oncekit/internal/testenv"
	"github.com/oncekit/oncekit/storage/memstore"
	"github.com/oncekit/oncekit/storage/redisstore"
)

func pct(samples []time.Duration, p float64) float64 {
	slices.Sort(samples)
	return float64(samples[int(float64(len(samples)-1)*p)].Nanoseconds()) / 1e3
}

// BenchmarkUnaryInterceptor: unary calls on a loopback gRPC server, bare
// and through UnaryServerInterceptor over redisstore, for new keys and for
// replays, with 1 and 16 concurrent clients. added-p50-µs and added-p99-µs
// are the interceptor's percentiles minus the bare server's; budget-µs is
// the goal (2 Redis round trips + 50 µs for a new key, 1 + 50 µs for a
// replay) from the p50 of a Redis PING timed right after every call
// (rtt-p50-µs). calls/s includes those PINGs. control-added-p50-µs is the
// control: a bare handler that makes the same Redis round trips itself
// with plain commands (SET NX PX and SET PX for a new key, GET for a
// replay), minus the bare server, its calls each followed by a timed
// PING as the interceptor's are (at 16 clients the PINGs load the
// machine too).
func BenchmarkUnaryInterceptor(b *testing.B) {
	c := redis.NewClient(&redis.Options{Addr: testenv.RedisAddrs(b, 1)[0], ContextTimeoutEnabled: true})
	defer c.Close()
	st, err := redisstore.New(c, redisstore.WithRecordPrefix(fmt.Sprintf("grpcmw-bench:%d:", time.Now().UnixNano())))
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	interceptor := func(st idemdriver.Store) grpc.UnaryServerInterceptor {
		g, err := idem.NewGuard(st)
		if err != nil {
			b.Fatal(err)
		}
		unary, err := grpcmw.UnaryServerInterceptor(g, grpcmw.Unscoped())
		if err != nil {
			b.Fatal(err)
		}
		return unary
	}
	start := func(opts ...grpc.ServerOption) testpb.OrdersClient {
		srv := grpc.NewServer(opts...)
		testpb.RegisterOrdersServer(srv, &orders{})
		return listen(b, srv)
	}
	bare := start()
	// controls[n] is a bare handler that makes the interceptor's n Redis
	// round trips itself with plain commands, as a hand-written
	// idempotency check would: SET NX PX to claim the call's key and SET
	// PX to store the reply (n = 2, a new key), or one GET (n = 1, a
	// replay). What those round trips cost from inside a gRPC handler on
	// this machine, whoever makes them.
	controls := map[int]testpb.OrdersClient{}
	prefix := fmt.Sprintf("grpcmw-bench-control:%d:", time.Now().UnixNano())
	for _, n := range []int{1, 2} {
		srv := grpc.NewServer()
		testpb.RegisterOrdersServer(srv, &orders{place: func(ctx context.Context, _ *testpb.PlaceRequest, run int64) (*testpb.PlaceReply, error) {
			key := prefix + strconv.FormatInt(run, 10)
			if n == 1 {
				if err := c.Get(ctx, key).Err(); err != nil && !errors.Is(err, redis.Nil) {
					return nil, err
				}
				return &testpb.PlaceReply{Run: run}, nil
			}
			if err := c.SetNX(ctx, key, "", 30*time.Second).Err(); err != nil {
				return nil, err
			}
			reply := &testpb.PlaceReply{Run: run}
			return reply, c.Set(ctx, key, "placed", 24*time.Hour).Err()
		}})
		controls[n] = listen(b, srv)
	}
	guardedBy := map[string]testpb.OrdersClient{
		"redis":  start(grpc.ChainUnaryInterceptor(interceptor(st))),
		"memory": start(grpc.ChainUnaryInterceptor(interceptor(memstore.New()))), // the interceptor's own cost
	}
	req := &testpb.PlaceRequest{Sku: "phone-x", Qty: 1, User: "alice"}
	// run makes n calls from clients goroutines; key(i) names call i's key.
	// With pings set, each call is followed by a timed Redis PING, so that
	// the round-trip figure sees the same machine load as the calls.
	run := func(client testpb.OrdersClient, n, clients int, key func(i int) string, pings ...[]time.Duration) []time.Duration {
		out := make([]time.Duration, n)
		var next atomic.Int64
		var wg sync.WaitGroup
		for range clients {
			wg.Go(func() {
				for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
					ctx := context.Background()
					if k := key(i); k != "" {
						ctx = metadata.AppendToOutgoingContext(ctx, grpcmw.DefaultMetadataKey, k)
					}
					t0 := time.Now()
					if _, err := client.Place(ctx, req); err != nil {
						b.Error(err)
						return
					}
					out[i] = time.Since(t0)
					if len(pings) > 0 {
						t1 := time.Now()
						c.Ping(context.Background())
						pings[0][i] = time.Since(t1)
					}
				}
			})
		}
		wg.Wait()
		return out
	}
	for _, store := range []string{"redis", "memory"} {
		guarded := guardedBy[store]
		for _, clients := range []int{1, 16} {
			for _, mode := range []string{"new-key", "replay"} {
				b.Run(fmt.Sprintf("%s/clients=%d/%s", store, clients, mode), func(b *testing.B) {
					n := max(b.N, 200)
					pings := make([]time.Duration, n)
					calls := func(client testpb.OrdersClient, key func(int) string, p ...[]time.Duration) []time.Duration {
						return run(client, n, clients, key, p...)
					}
					base := fmt.Sprintf("%s-%d-%d", mode, clients, time.Now().UnixNano())
					if mode == "replay" {
						run(guarded, 1, 1, func(int) string { return base }) // store it once
					}
					b.ResetTimer()
					t0 := time.Now()
					mw := calls(guarded, func(i int) string {
						if mode == "replay" {
							return base
						}
						return fmt.Sprintf("%s-%d", base, i)
					}, pingsIf(store == "redis", pings)...)
					elapsed := time.Since(t0)
					b.StopTimer()
					plain := calls(bare, func(int) string { return "" })
					trips := 2
					if mode == "replay" {
						trips = 1
					}
					b.ReportMetric(float64(n)/elapsed.Seconds(), "calls/s")
					b.ReportMetric(pct(mw, 0.5)-pct(plain, 0.5), "added-p50-µs")
					b.ReportMetric(pct(mw, 0.99)-pct(plain, 0.99), "added-p99-µs")
					if store == "redis" {
						b.ReportMetric(pct(pings, 0.5), "rtt-p50-µs")
						b.ReportMetric(float64(trips)*pct(pings, 0.5)+50, "budget-µs")
						// (With a timed PING after each call too, as the
						// interceptor's calls had: the same load.)
						control := calls(controls[trips], func(int) string { return "" }, make([]time.Duration, n))
						b.ReportMetric(pct(control, 0.5)-pct(plain, 0.5), "control-added-p50-µs")
					}
				})
			}
		}
	}
}

// pingsIf passes pings to run only when the store is Redis.
func pingsIf(on bool, pings []time.Duration) [][]time.Duration {
	if on {
		return [][]time.Duration{pings}
	}
	return nil
}
