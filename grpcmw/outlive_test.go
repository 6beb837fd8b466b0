package grpcmw_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/grpcmw"
	"github.com/oncekit/oncekit/grpcmw/internal/testpb"
	"github.com/oncekit/oncekit/storage/memstore"
)

// cancelInBegin is memstore whose Begin cancels the call (cancel) and
// reports whether its own context ended with it.
type cancelInBegin struct {
	*memstore.Store
	cancel context.CancelFunc
	ended  chan error
}

func (s *cancelInBegin) Begin(ctx context.Context, k idem.Key, fp string, lease time.Duration) (idem.Claim, error) {
	s.cancel()
	s.ended <- ctx.Err()
	return s.Store.Begin(ctx, k, fp, lease)
}

// A call's claim outlives the call (idem.ClaimOutlivesCaller): the store's
// Begin is not under the call's cancellation, so a store can make it on
// the handler's goroutine; the handler does not run for a call that left.
func TestClaimOutlivesCall(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	st := &cancelInBegin{Store: memstore.New(), cancel: cancel, ended: make(chan error, 1)}
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
	if err := <-st.ended; err != nil {
		t.Errorf("the claim's context ended with the call's: %v", err)
	}
}
