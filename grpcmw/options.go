package grpcmw

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/internal/mwcore"
)

// Metadata keys.
const (
	// DefaultMetadataKey carries the idempotency key of a call.
	DefaultMetadataKey = "idempotency-key"
	// ReplayedMetadataKey is set to "true" in the header metadata of a
	// replayed response.
	ReplayedMetadataKey = "idempotent-replayed"
)

// Option configures the server interceptors.
type Option func(*config)

type config struct {
	metadataKey string
	extract     func(ctx context.Context, req any) (string, bool)
	scope       func(ctx context.Context) string
	place       func(ctx context.Context, req any) string
	fingerprint func(fullMethod string, req proto.Message) (string, error)
	common      mwcore.Config // the key space chosen, the wait, failing open
	selector    func(fullMethod string) bool
	final       func(error) bool
	optional    bool
	errs        []error
}

// WithKeyMetadata sets the metadata key that carries the idempotency key.
// Default "idempotency-key".
func WithKeyMetadata(name string) Option {
	return func(c *config) {
		if name == "" {
			c.errs = append(c.errs, errors.New("empty metadata key"))
		}
		c.metadataKey = name
	}
}

// WithKeyExtractor takes the key from the request when the metadata has
// none: an AIP-155 request_id field, say. extract reports false when the
// request carries no key.
func WithKeyExtractor(extract func(ctx context.Context, req any) (string, bool)) Option {
	return func(c *config) { c.extract = extract }
}

// WithScope derives the scope of a call — the authenticated principal, a
// tenant — which becomes part of the stored key with the full method name,
// so that one principal can never replay another's response. Every
// interceptor must choose: WithScope, or Unscoped. A call whose scope
// function returns "" is refused with Internal, nothing run: an empty scope
// is the key space unscoped calls share.
func WithScope(scope func(ctx context.Context) string) Option {
	return func(c *config) {
		if scope == nil {
			c.errs = append(c.errs, errors.New("nil scope function"))
		}
		c.scope = scope
		c.common.ChooseScope()
	}
}

// WithPlacement places each unary call's record (idem.Placed) where the
// handler's effect lives: on Redis Cluster, in the slot of the hash tag
// {place}, so that an effect on keys tagged {place} (a SKU's stock and
// orders) commits in the script that completes the record (idem.Commit in the handler).
// Other stores keep a placed record as any other. "" leaves the call's
// record unplaced; a place over idemdriver.MaxPlaceLen bytes or with a brace gets
// the call refused with InvalidArgument, nothing run. The place is part of
// the stored key: keep it a function of the request, the same on every
// retry. Streams (whose request is not known when the key is claimed) are
// never placed.
func WithPlacement(place func(ctx context.Context, req any) string) Option {
	return func(c *config) {
		if place == nil {
			c.errs = append(c.errs, errors.New("nil placement function"))
		}
		c.place = place
	}
}

// WithFingerprint replaces what makes two unary calls with one key "the
// same request" (a duplicate is replayed, another request with the key is
// refused with FailedPrecondition): to leave out a field a client changes
// on every retry (a timestamp, a trace ID), say. An error refuses the call
// with InvalidArgument, nothing run. Default DefaultFingerprint.
func WithFingerprint(fingerprint func(fullMethod string, req proto.Message) (string, error)) Option {
	return func(c *config) {
		if fingerprint == nil {
			c.errs = append(c.errs, errors.New("nil fingerprint function"))
		}
		c.fingerprint = fingerprint
	}
}

// DefaultFingerprint is the full method and the request's deterministic
// protobuf encoding: every field, unknown fields included.
func DefaultFingerprint(fullMethod string, req proto.Message) (string, error) {
	buf := marshalBufs.Get().(*[]byte)
	defer marshalBufs.Put(buf)
	body, err := proto.MarshalOptions{Deterministic: true}.MarshalAppend((*buf)[:0], req)
	if err != nil {
		return "", err
	}
	if cap(body) <= 64<<10 { // (a larger one is not kept)
		*buf = body
	}
	return idem.Fingerprint([]byte(fullMethod), body), nil
}

// marshalBufs are DefaultFingerprint's buffers: a request is marshalled
// only to be hashed.
var marshalBufs = sync.Pool{New: func() any { return new([]byte) }}

// Unscoped puts the keys of every caller of a method in one key space.
// Only for services without principals, or behind a gateway that scopes
// keys.
func Unscoped() Option { return func(c *config) { c.common.ChooseScope() } }

// WithSelector limits the interceptor to the methods for which selected
// reports true (full method names, "/pkg.Service/Method"). Other calls
// pass through untouched. Default: every method except health checking
// (/grpc.health.v1.Health/) and reflection (/grpc.reflection.v1.ServerReflection/
// and v1alpha), so that Kubernetes probes and grpcurl work without a key.
// A selector replaces that default.
func WithSelector(selected func(fullMethod string) bool) Option {
	return func(c *config) { c.selector = selected }
}

// WithFinal decides which handler errors are final: stored and replayed to
// every duplicate as the same status with its details. Any other error
// drops the claim so that a retry runs the handler again. Default
// DefaultFinal.
func WithFinal(final func(error) bool) Option {
	return func(c *config) {
		if final == nil {
			c.errs = append(c.errs, errors.New("nil final function"))
		}
		c.final = final
	}
}

// DefaultFinal is final for the codes a retry of the same request cannot
// change: InvalidArgument, NotFound, AlreadyExists, PermissionDenied,
// FailedPrecondition, OutOfRange and Unauthenticated.
func DefaultFinal(err error) bool {
	switch status.Code(err) {
	case codes.InvalidArgument, codes.NotFound, codes.AlreadyExists, codes.PermissionDenied,
		codes.FailedPrecondition, codes.OutOfRange, codes.Unauthenticated:
		return true
	}
	return false
}

// WithOptionalKey lets calls without a key through, without idempotency,
// instead of answering InvalidArgument. A malformed key is still refused.
func WithOptionalKey() Option { return func(c *config) { c.optional = true } }

// WithWait makes a duplicate that arrives while the first call runs wait up
// to d for its response and replay it, instead of failing with Aborted at
// once. Default: the Guard's own wait (idem.WithWait), which is 0.
func WithWait(d time.Duration) Option {
	return func(c *config) { c.common.SetWait(d) }
}

// WithFailOpen runs the handler without idempotency when the store cannot
// be reached, instead of answering Unavailable. Duplicates may then run
// twice.
func WithFailOpen() Option { return func(c *config) { c.common.SetFailOpen() } }

func newConfig(opts []Option) (*config, error) {
	c := &config{metadataKey: DefaultMetadataKey, final: DefaultFinal, fingerprint: DefaultFingerprint}
	for _, o := range opts {
		o(c)
	}
	if err := errors.Join(errors.Join(c.errs...), c.common.Check()); err != nil {
		return nil, fmt.Errorf("grpcmw: %w", err)
	}
	return c, nil
}

// RequestIDField is a key extractor (WithKeyExtractor) for APIs that
// follow Google's AIP-155: the key is the request's string field of that
// name (usually "request_id"), read through protoreflect, so any message
// with such a field works without generated code of its own. A request
// without the field, or with it empty, carries no key.
func RequestIDField(name string) func(ctx context.Context, req any) (string, bool) {
	fname := protoreflect.Name(name)
	return func(_ context.Context, req any) (string, bool) {
		msg, ok := req.(proto.Message)
		if !ok {
			return "", false
		}
		m := msg.ProtoReflect()
		fd := m.Descriptor().Fields().ByName(fname)
		if fd == nil || fd.Kind() != protoreflect.StringKind || fd.IsList() || fd.IsMap() {
			return "", false
		}
		v := m.Get(fd).String()
		return v, v != ""
	}
}
