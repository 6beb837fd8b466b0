package inventory

import (
	"context"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/oncekit/oncekit/core/lock"
)

// A store's own gRPC status inside an error (etcd's client answers a
// request its context cut off with "code = Unknown") is not the service's
// answer: the buyer gets Unavailable and retries. A lock wait that ran out
// is busy, as over HTTP. (A fresh-clone make test's flash sale on etcd
// with a replica killed gave a buyer the etcd client's Unknown, which
// clients take as final.)
func TestGRPCErrorStoreStatusIsRetryable(t *testing.T) {
	for _, c := range []struct {
		err    error
		code   codes.Code
		reason string
	}{
		{fmt.Errorf("inventory: lock sku x: %w", fmt.Errorf("%w\n%w", lock.ErrNotAcquired, status.Error(codes.Unknown, "context deadline exceeded"))), codes.Unavailable, "busy"},
		{fmt.Errorf("inventory: read: %w", status.Error(codes.Unknown, "etcdserver: request timed out")), codes.Unavailable, "store_unavailable"},
		{fmt.Errorf("inventory: %w", context.DeadlineExceeded), codes.Unavailable, "busy"},
		{ErrSoldOut, codes.FailedPrecondition, "sold_out"},
	} {
		st := status.Convert(grpcError(c.err))
		if st.Code() != c.code || reason(st) != c.reason {
			t.Errorf("grpcError(%v) = %v (reason %q), want %v %q", c.err, st.Code(), reason(st), c.code, c.reason)
		}
	}
	if err := status.Error(codes.PermissionDenied, "no"); grpcError(err) != err {
		t.Error("the service's own status was not passed as it is")
	}
}

func reason(st *status.Status) string {
	for _, d := range st.Details() {
		if r, ok := d.(interface{ GetReason() string }); ok {
			return r.GetReason()
		}
	}
	return ""
}
