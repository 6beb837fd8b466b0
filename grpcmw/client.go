package grpcmw

import (
	"context"

	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// ClientOption configures UnaryClientInterceptor.
type ClientOption func(*clientConfig)

type clientConfig struct {
	metadataKey string
	selector    func(fullMethod string) bool
	newKey      func() string
}

// WithClientKeyMetadata sets the metadata key the client interceptor
// writes. Default "idempotency-key".
func WithClientKeyMetadata(name string) ClientOption {
	return func(c *clientConfig) { c.metadataKey = name }
}

// WithClientSelector limits key minting to the methods for which selected
// reports true. Default: every method.
func WithClientSelector(selected func(fullMethod string) bool) ClientOption {
	return func(c *clientConfig) { c.selector = selected }
}

// WithKeyGenerator replaces the key generator (default NewKey: a version 7
// UUID).
func WithKeyGenerator(newKey func() string) ClientOption {
	return func(c *clientConfig) { c.newKey = newKey }
}

// NewKey returns a fresh idempotency key: a version 7 UUID, as AIP-155
// expects of a request_id (idemdriver.NewKey).
func NewKey() string { return idemdriver.NewKey() }

// UnaryClientInterceptor gives every logical call that has no
// idempotency key one, in its outgoing metadata, before gRPC sends it: the
// retries gRPC makes itself (a service-config retry policy, transparent
// retries) resend the same metadata, so every attempt of one logical call
// carries one key and the server runs it once. A call whose metadata
// already has a key keeps it: an application that retries a logical call
// itself must reuse its key (idem keys belong to the logical operation).
func UnaryClientInterceptor(opts ...ClientOption) grpc.UnaryClientInterceptor {
	c := &clientConfig{metadataKey: DefaultMetadataKey, newKey: NewKey}
	for _, o := range opts {
		o(c)
	}
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, callOpts ...grpc.CallOption) error {
		if c.selector == nil || c.selector(method) {
			if md, _ := metadata.FromOutgoingContext(ctx); len(md.Get(c.metadataKey)) == 0 {
				ctx = metadata.AppendToOutgoingContext(ctx, c.metadataKey, c.newKey())
			}
		}
		return invoker(ctx, method, req, reply, cc, callOpts...)
	}
}
