package grpcmw_test

import (
	"context"
	"fmt"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/grpcmw"
	"github.com/oncekit/oncekit/grpcmw/internal/testpb"
	"github.com/oncekit/oncekit/storage/memstore"
)

// A gRPC order service: the client interceptor gives the call a key, and
// the retry of the call gets the first reply back, marked as replayed.
func Example() {
	guard, err := idem.NewGuard(memstore.New()) // or redisstore, redlockstore, etcdstore
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
	testpb.RegisterOrdersServer(srv, &orders{})
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	go func() { _ = srv.Serve(ln) }()
	defer srv.Stop()

	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	client := testpb.NewOrdersClient(conn)
	// The application's own retry reuses the key of its logical call.
	ctx := metadata.AppendToOutgoingContext(context.Background(),
		"x-customer", "alice", grpcmw.DefaultMetadataKey, grpcmw.NewKey())
	for range 2 {
		var header metadata.MD
		reply, err := client.Place(ctx, &testpb.PlaceRequest{Sku: "phone", Qty: 1}, grpc.Header(&header))
		fmt.Println(reply.GetOrderId(), err, "replayed:", header.Get(grpcmw.ReplayedMetadataKey))
	}
	// Output:
	// order-1 <nil> replayed: []
	// order-1 <nil> replayed: [true]
}
