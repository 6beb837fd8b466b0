package grpcmw_test

import (
	"context"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemtest"
	"github.com/oncekit/oncekit/grpcmw"
	"github.com/oncekit/oncekit/grpcmw/internal/testpb"
	"github.com/oncekit/oncekit/storage/memstore"
)

// A call's claim outlives the call (idemdriver.ClaimOutlivesCaller): the store's
// Begin is not under the call's cancellation, so a store can make it on
// the handler's goroutine; the handler does not run for a call that left.
func TestClaimOutlivesCall(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	ended := make(chan error, 1)
	st := idemtest.BeforeBegin(memstore.New(), func(bctx context.Context) {
		cancel() // the call ends while its claim is on the way
		ended <- bctx.Err()
	})
	g, err := idem.NewGuard(st)
	if err != nil {
		t.Fatal(err)
	}
	unary, err := grpcmw.UnaryServerInterceptor(g, grpcmw.Unscoped())
	if err != nil {
		t.Fatal(err)
	}
	ctx = metadata.NewIncomingContext(ctx, metadata.Pairs(grpcmw.DefaultMetadataKey, "k-outlives"))
	ctx = grpc.NewContextWithServerTransportStream(ctx, stream{})
	_, err = unary(ctx, &testpb.PlaceRequest{Sku: "phone-x"}, &grpc.UnaryServerInfo{FullMethod: "/testpb.Orders/Place"},
		func(context.Context, any) (any, error) {
			t.Error("the handler ran for a call that had left")
			return &testpb.PlaceReply{}, nil
		})
	if err == nil {
		t.Error("a call that left got no error")
	}
	if err := <-ended; err != nil {
		t.Errorf("the claim's context ended with the call's: %v", err)
	}
}
