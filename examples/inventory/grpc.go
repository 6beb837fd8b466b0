package inventory

import (
	"context"
	"errors"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/examples/inventory/inventorypb"
	"github.com/oncekit/oncekit/grpcmw"
)

// UserMetadataKey carries the caller's principal in the demo's gRPC API.
// A real service takes it from its authentication (a verified token), not
// from what the client says.
const UserMetadataKey = "x-user"

// GRPCServer returns a gRPC server with the replica's API, PlaceOrder made
// idempotent by grpcmw.
func (s *Service) GRPCServer(opts ...grpc.ServerOption) (*grpc.Server, error) {
	idempotent, err := grpcmw.UnaryServerInterceptor(s.guard,
		grpcmw.WithScope(func(ctx context.Context) string {
			md, _ := metadata.FromIncomingContext(ctx)
			if u := md.Get(UserMetadataKey); len(u) > 0 && u[0] != "" {
				return "user:" + u[0]
			}
			return "" // refused by grpcmw; authenticate below has answered first
		}),
		grpcmw.WithPlacement(func(_ context.Context, req any) string {
			if r, ok := req.(*inventorypb.PlaceOrderRequest); ok {
				return placeOf(r.GetSku())
			}
			return ""
		}),
		grpcmw.WithSelector(func(m string) bool { return m == inventorypb.Inventory_PlaceOrder_FullMethodName }),
		grpcmw.WithWait(s.wait))
	if err != nil {
		return nil, err
	}
	// The outer interceptor releases the SKU lock a call took once grpcmw
	// has committed its sale with the record.
	release := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		holdLocks(ctx, func(ctx context.Context) { resp, err = handler(ctx, req) })
		return resp, err
	}
	// The demo's authentication: an order names its caller. (grpcmw would
	// refuse a call whose scope is empty with Internal; a caller without a
	// principal is the client's fault, Unauthenticated.)
	authenticate := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		if info.FullMethod == inventorypb.Inventory_PlaceOrder_FullMethodName && (len(md.Get(UserMetadataKey)) == 0 || md.Get(UserMetadataKey)[0] == "") {
			return nil, status.Errorf(codes.Unauthenticated, "inventory: %s metadata names the caller", UserMetadataKey)
		}
		return handler(ctx, req)
	}
	srv := grpc.NewServer(append(opts, grpc.ChainUnaryInterceptor(authenticate, release, idempotent))...)
	inventorypb.RegisterInventoryServer(srv, &grpcAPI{s: s})
	// Health checking (Kubernetes' grpc probes) and reflection (grpcurl):
	// grpcmw passes both through without a key.
	healthpb.RegisterHealthServer(srv, grpcHealth{s: s})
	reflection.Register(srv)
	return srv, nil
}

// grpcHealth answers grpc.health.v1 Check with Service.Healthy, for the
// server as a whole ("") and for the Inventory service. Watch and List are
// not served (Unimplemented): probes call Check.
type grpcHealth struct {
	healthpb.UnimplementedHealthServer
	s *Service
}

func (h grpcHealth) Check(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	switch req.GetService() {
	case "", inventorypb.Inventory_ServiceDesc.ServiceName:
	default:
		return nil, status.Errorf(codes.NotFound, "inventory: no service %q", req.GetService())
	}
	if err := h.s.Healthy(ctx); err != nil {
		return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_NOT_SERVING}, nil
	}
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

type grpcAPI struct {
	inventorypb.UnimplementedInventoryServer
	s *Service
}

func (g *grpcAPI) PutItem(ctx context.Context, req *inventorypb.PutItemRequest) (*inventorypb.Item, error) {
	it, err := g.s.putItem(ctx, req.GetSku(), req.GetStock())
	if err != nil {
		return nil, grpcError(err)
	}
	return pbItem(it), nil
}

func (g *grpcAPI) GetItem(ctx context.Context, req *inventorypb.GetItemRequest) (*inventorypb.Item, error) {
	if err := CheckSKU(req.GetSku()); err != nil {
		return nil, grpcError(err)
	}
	it, err := g.s.backend.Item(ctx, req.GetSku())
	if err != nil {
		return nil, grpcError(err)
	}
	return pbItem(it), nil
}

func (g *grpcAPI) PlaceOrder(ctx context.Context, req *inventorypb.PlaceOrderRequest) (*inventorypb.Order, error) {
	o, err := g.s.placeOrder(ctx, req.GetSku(), req.GetQty(), req.GetUser(), func(effect any) error {
		return idem.Commit(ctx, effect)
	})
	if err != nil {
		return nil, grpcError(err)
	}
	return pbOrder(o), nil
}

func (g *grpcAPI) GetOrder(ctx context.Context, req *inventorypb.GetOrderRequest) (*inventorypb.Order, error) {
	o, err := g.s.backend.Order(ctx, req.GetOrderId())
	if err != nil {
		return nil, grpcError(err)
	}
	return pbOrder(o), nil
}

func pbItem(it Item) *inventorypb.Item {
	return &inventorypb.Item{Sku: it.SKU, Stock: it.Stock, Sold: it.Sold}
}

func pbOrder(o Order) *inventorypb.Order {
	return &inventorypb.Order{OrderId: o.OrderID, Sku: o.SKU, Qty: o.Qty, User: o.User, Fence: o.Fence}
}

// grpcError is err as a status. FailedPrecondition, NotFound and
// InvalidArgument are final for grpcmw: stored and replayed.
func grpcError(err error) error {
	withReason := func(c codes.Code, reason, msg string) error {
		st := status.New(c, msg)
		if d, derr := st.WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: "inventory.oncekit.dev"}); derr == nil {
			st = d
		}
		return st.Err()
	}
	switch {
	case errors.Is(err, ErrInvalid):
		return withReason(codes.InvalidArgument, "invalid_request", err.Error())
	case errors.Is(err, ErrUnknownSKU):
		return withReason(codes.NotFound, "unknown_sku", "no item has this sku")
	case errors.Is(err, ErrUnknownOrder):
		return withReason(codes.NotFound, "unknown_order", "no order has this id")
	case errors.Is(err, ErrSoldOut):
		return withReason(codes.FailedPrecondition, "sold_out", "not enough stock")
	case errors.Is(err, idem.ErrEffectRefused):
		return withReason(codes.Aborted, "conflict", "the sale lost its claim before it committed; retry")
	case errors.Is(err, lock.ErrNotAcquired), errors.Is(err, context.DeadlineExceeded):
		return withReason(codes.Unavailable, "busy", "the item is busy; retry")
	}
	// A status of this service's own passes as it is; one wrapped inside
	// (an etcd client's "code = Unknown" from a request the lock wait cut
	// off) is the store's, not the caller's: retryable.
	if _, ok := err.(interface{ GRPCStatus() *status.Status }); ok {
		return err
	}
	return withReason(codes.Unavailable, "store_unavailable", err.Error())
}
