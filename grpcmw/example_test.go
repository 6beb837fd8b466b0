package grpcmw_test

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/grpcmw"
	"github.com/oncekit/oncekit/storage/memstore"
)

// placeOrder is a unary method "/shop.Orders/Place" that takes a SKU and
// answers an order ID (well-known wrapper messages stand in for an
// application's own generated ones).
var placed atomic.Int64

var ordersService = grpc.ServiceDesc{
	ServiceName: "shop.Orders",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Place",
		Handler: func(_ any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
			req := new(wrapperspb.StringValue)
			if err := dec(req); err != nil {
				return nil, err
			}
			place := func(ctx context.Context, req any) (any, error) {
				sku := req.(*wrapperspb.StringValue).GetValue()
				return wrapperspb.String(fmt.Sprintf("order-%d (%s)", placed.Add(1), sku)), nil
			}
			info := &grpc.UnaryServerInfo{FullMethod: "/shop.Orders/Place"}
			return interceptor(ctx, req, info, place)
		},
	}},
}

// A gRPC order service: the caller gives its logical call a key, and the
// retry of the call gets the first reply back, marked as replayed.
func Example() {
	guard, err := idem.NewGuard(memstore.New()) // or any store of package storage
	if err != nil {
		panic(err)
	}
	unary, err := grpcmw.UnaryServerInterceptor(guard,
		// One customer can never replay another's reply.
		grpcmw.WithScope(func(ctx context.Context) string {
			md, _ := metadata.FromIncomingContext(ctx)
			return fmt.Sprint(md.Get("x-customer"))
		}))
	if err != nil {
		panic(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(unary))
	srv.RegisterService(&ordersService, struct{}{})
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	go func() { _ = srv.Serve(ln) }()
	defer srv.Stop()

	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	// The application's own retry reuses the key of its logical call.
	ctx := metadata.AppendToOutgoingContext(context.Background(),
		"x-customer", "alice", grpcmw.DefaultMetadataKey, grpcmw.NewKey())
	for range 2 {
		var header metadata.MD
		reply := new(wrapperspb.StringValue)
		err := conn.Invoke(ctx, "/shop.Orders/Place", wrapperspb.String("phone"), reply, grpc.Header(&header))
		fmt.Println(reply.GetValue(), err, "replayed:", header.Get(grpcmw.ReplayedMetadataKey))
	}
	// Output:
	// order-1 (phone) <nil> replayed: []
	// order-1 (phone) <nil> replayed: [true]
}
