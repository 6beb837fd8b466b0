package grpcmw_test

import (
	"context"
	"strconv"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/grpcmw"
	"github.com/oncekit/oncekit/grpcmw/internal/testpb"
	"github.com/oncekit/oncekit/storage/memstore"
)

// BenchmarkInterceptorCost: the unary interceptor called directly (no
// network, no gRPC transport) over memstore, for a new key and a replay:
// what the interceptor itself costs per call, in time and allocations.
func BenchmarkInterceptorCost(b *testing.B) {
	g, err := idem.NewGuard(memstore.New())
	if err != nil {
		b.Fatal(err)
	}
	unary, err := grpcmw.UnaryServerInterceptor(g, grpcmw.Unscoped())
	if err != nil {
		b.Fatal(err)
	}
	info := &grpc.UnaryServerInfo{FullMethod: "/testpb.Orders/Place"}
	req := &testpb.PlaceRequest{Sku: "phone-x", Qty: 1, User: "alice"}
	handler := func(ctx context.Context, req any) (any, error) {
		return &testpb.PlaceReply{Run: 1}, nil
	}
	// bare: the handler alone, under the same context: subtract it to get
	// the interceptor's own cost.
	for _, mode := range []string{"bare", "new-key", "replay"} {
		b.Run(mode, func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				key := "k-" + mode
				if mode == "new-key" {
					key += strconv.Itoa(i)
				}
				ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs(grpcmw.DefaultMetadataKey, key))
				ctx = grpc.NewContextWithServerTransportStream(ctx, stream{})
				if mode == "bare" {
					if _, err := handler(ctx, req); err != nil {
						b.Fatal(err)
					}
					continue
				}
				if _, err := unary(ctx, req, info, handler); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// stream is the server transport stream of a call without a network, as
// gRPC gives an interceptor.
type stream struct{}

func (stream) Method() string               { return "/testpb.Orders/Place" }
func (stream) SetHeader(metadata.MD) error  { return nil }
func (stream) SendHeader(metadata.MD) error { return nil }
func (stream) SetTrailer(metadata.MD) error { return nil }
