package grpcmw

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/observe"
	"github.com/oncekit/oncekit/internal/mwcore"
)

// errNotStored is what a run returns for an outcome that must not be
// stored: the Guard drops the claim, so that a retry runs again.
type errNotStored struct{ err error }

func (e errNotStored) Error() string { return "not stored: " + e.err.Error() }
func (e errNotStored) Unwrap() error { return e.err }

type server struct {
	cfg   *config
	guard *idem.Guard
}

// UnaryServerInterceptor makes unary calls idempotent with guard: the
// first call with a key runs the handler and its reply (or final error)
// is stored; duplicates get it replayed, with "idempotent-replayed: true"
// in the header metadata. See the package documentation for the rules.
func UnaryServerInterceptor(guard *idem.Guard, opts ...Option) (grpc.UnaryServerInterceptor, error) {
	s, err := newServer(guard, opts)
	if err != nil {
		return nil, err
	}
	return s.unary, nil
}

// StreamServerInterceptor runs at most one stream per key at a time: a
// stream whose key is held by a running stream fails with Aborted (or
// waits, WithWait). It stores and replays nothing: streams are not
// replayable, and a stream that ends lets the next one with its key run.
// Streams without a key pass through unless the key is required.
func StreamServerInterceptor(guard *idem.Guard, opts ...Option) (grpc.StreamServerInterceptor, error) {
	s, err := newServer(guard, opts)
	if err != nil {
		return nil, err
	}
	return s.stream, nil
}

func newServer(guard *idem.Guard, opts []Option) (*server, error) {
	if guard == nil {
		return nil, errors.New("grpcmw: nil Guard")
	}
	c, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	return &server{cfg: c, guard: guard}, nil
}

// key returns the call's key from its metadata (or the request, through
// the extractor); ok is false when the call carries none.
func (s *server) key(ctx context.Context, req any) (key string, ok bool, err error) {
	vals := metadata.ValueFromIncomingContext(ctx, s.cfg.metadataKey) // (not the whole map, as FromIncomingContext copies it)
	switch {
	case len(vals) > 1:
		return "", false, status.Errorf(codes.InvalidArgument, "grpcmw: %d %s values; send one", len(vals), s.cfg.metadataKey)
	case len(vals) == 1:
		key = vals[0]
	case s.cfg.extract != nil && req != nil:
		key, ok = s.cfg.extract(ctx, req)
		if !ok {
			return "", false, nil
		}
	default:
		return "", false, nil
	}
	if err := idemdriver.CheckClientKey(key); err != nil {
		return "", false, status.Errorf(codes.InvalidArgument, "grpcmw: %s: %v", s.cfg.metadataKey, err)
	}
	return key, true, nil
}

// stored is the key in the store: the scope, the full method and the key,
// placed by the request (WithPlacement) when there is one.
// A scope function that returns "" refuses the call (Internal): an empty
// scope is the key space every unscoped call shares, where one principal's
// key could replay to another.
func (s *server) stored(ctx context.Context, fullMethod, key string, req any) (idemdriver.Key, error) {
	scope := ""
	if s.cfg.scope != nil {
		if scope = s.cfg.scope(ctx); scope == "" {
			return idemdriver.Key{}, status.Errorf(codes.Internal, "grpcmw: %s: the scope function returned an empty scope "+
				"(return the caller's principal, or use Unscoped)", fullMethod)
		}
	}
	place := ""
	if s.cfg.place != nil && req != nil {
		place = s.cfg.place(ctx, req)
	}
	stored, err := idemdriver.StoredKey(scope, fullMethod, key, place)
	if err != nil {
		return idemdriver.Key{}, status.Errorf(codes.InvalidArgument, "grpcmw: %s: %v", fullMethod, err)
	}
	return stored, nil
}

// infrastructure reports the methods every server may serve besides its
// own, which the interceptors pass through unless WithSelector says
// otherwise: health checking (grpc.health.v1) and reflection.
func infrastructure(fullMethod string) bool {
	for _, p := range []string{"/grpc.health.v1.Health/", "/grpc.reflection.v1.ServerReflection/",
		"/grpc.reflection.v1alpha.ServerReflection/"} {
		if strings.HasPrefix(fullMethod, p) {
			return true
		}
	}
	return false
}

// selected reports whether the interceptors act on fullMethod.
func (s *server) selected(fullMethod string) bool {
	if s.cfg.selector != nil {
		return s.cfg.selector(fullMethod)
	}
	return !infrastructure(fullMethod)
}

// OpCall is the observe.Op of one unary call through the interceptor: its
// Route is the full method.
const OpCall observe.Op = "grpc.call"

// grpcCall marks the interceptor's events: a request answered.
var grpcCall = observe.Request{Attrs: []observe.Attr{{Key: "rpc.system", Value: "grpc"}}}

func (s *server) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if !s.selected(info.FullMethod) {
		return handler(ctx, req)
	}
	// One OpCall event per call, as httpmw reports its requests.
	ctx, call := observe.BeginEvent(ctx, s.guard.Observer(), observe.Event{Op: OpCall, Driver: s.guard.DriverName(), Request: &grpcCall})
	call.Route(info.FullMethod)
	var tr callTrace
	resp, err := s.unaryCall(ctx, req, info, handler, &tr)
	call.End(tr.outcome(err), 0, err)
	return resp, err
}

// callTrace is what a call did, for its event.
type callTrace struct{ ran, replayed bool }

// outcome names how a call with final error err ended.
func (tr callTrace) outcome(err error) observe.Outcome {
	switch {
	case tr.replayed:
		return observe.Replayed
	case tr.ran || err == nil:
		return observe.Executed
	}
	switch status.Code(err) {
	case codes.InvalidArgument:
		return observe.Invalid
	case codes.FailedPrecondition:
		return observe.Mismatch
	case codes.Aborted:
		return observe.InFlight
	case codes.Canceled, codes.DeadlineExceeded:
		return observe.Canceled
	}
	return observe.Error
}

func (s *server) unaryCall(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler, tr *callTrace) (any, error) {
	key, ok, err := s.key(ctx, req)
	switch {
	case err != nil:
		return nil, err
	case !ok && s.cfg.optional:
		tr.ran = true
		return handler(ctx, req)
	case !ok:
		return nil, status.Errorf(codes.InvalidArgument, "grpcmw: %s needs an %s", info.FullMethod, s.cfg.metadataKey)
	}
	msg, isProto := req.(proto.Message)
	if !isProto {
		return nil, status.Errorf(codes.Internal, "grpcmw: %s: request %T is not a protocol buffer", info.FullMethod, req)
	}
	fp, err := s.cfg.fingerprint(info.FullMethod, msg)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "grpcmw: %s: the request's fingerprint: %v", info.FullMethod, err)
	}
	stored, err := s.stored(ctx, info.FullMethod, key, req)
	if err != nil {
		return nil, err
	}
	ctx = s.cfg.common.Context(ctx)
	var (
		ran      bool
		resp     any
		firstErr error
	)
	result, replayed, err := s.guard.Do(idemdriver.ClaimOutlivesCaller(idemdriver.AnswersOnReturn(ctx)), stored.String(), fp, func(rctx context.Context) ([]byte, error) {
		ran, tr.ran = true, true
		resp, firstErr = handler(rctx, req)
		return s.outcome(resp, firstErr)
	})
	tr.replayed = err == nil && replayed && !ran
	switch {
	case ran && err == nil:
		return resp, firstErr // the handler answered and its outcome is stored
	case ran && errors.As(err, new(errNotStored)) && firstErr != nil:
		return resp, firstErr // a non-final error: not stored, and it says nothing was done
	case ran && errors.As(err, new(errNotStored)):
		// A reply that cannot be stored was not committed, nor the effect
		// the handler may have committed with it: never a success.
		return nil, status.Errorf(codes.Internal, "grpcmw: %s: %v; nothing was done", info.FullMethod, err)
	case ran:
		return nil, s.storeError(ctx, err)
	case err == nil && replayed:
		m, final, derr := decodeOutcome(result)
		if derr != nil {
			return nil, status.Errorf(codes.Internal, "grpcmw: the stored outcome of this key cannot be read; an operator can delete it (oncectl record delete)")
		}
		_ = grpc.SetHeader(ctx, replayedHeader) // (gRPC copies it into the call's header)
		if final != nil {
			return nil, final
		}
		return m, nil
	default:
		if err2 := s.guardError(ctx, err); err2 != nil {
			return nil, err2
		}
		tr.ran = true
		return handler(ctx, req) // fail open
	}
}

// replayedHeader is the header of a replayed answer, made once: gRPC
// merges a copy of it into the call's header and never changes it.
var replayedHeader = metadata.Pairs(ReplayedMetadataKey, "true")

// outcome turns the handler's answer into the stored bytes, or errNotStored.
func (s *server) outcome(resp any, err error) ([]byte, error) {
	if err != nil {
		if !s.cfg.final(err) {
			return nil, errNotStored{err}
		}
		return encodeStatus(status.Convert(err))
	}
	m, ok := resp.(proto.Message)
	if !ok {
		return nil, errNotStored{fmt.Errorf("reply %T is not a protocol buffer", resp)}
	}
	return encodeReply(m)
}

// storeError is the status of a run whose outcome could not be stored.
func (s *server) storeError(ctx context.Context, err error) error {
	switch mwcore.UnsettledBy(err) {
	case mwcore.Lost:
		return status.Error(codes.Aborted, "grpcmw: the call's claim was lost while it ran; retry with the same key")
	case mwcore.EffectRefused:
		// The effect's own check failed at commit (idem.Commit): nothing
		// was written, the record included, so the same key runs again.
		return status.Errorf(codes.Aborted, "grpcmw: the call's effect was refused, nothing was done; retry with the same key: %v", err)
	case mwcore.NotCommitted:
		// An answer, not a fault: the same call would meet it again.
		return status.Errorf(codes.Internal, "grpcmw: the call's outcome was not committed, nothing was done: %v", err)
	}
	return status.Error(codes.Unavailable, "grpcmw: the outcome could not be stored; retry with the same key")
}

// guardError maps the Guard's refusals to statuses; nil means fail open.
func (s *server) guardError(ctx context.Context, err error) error {
	switch refusal, after := s.cfg.common.Refused(ctx, err); refusal {
	case mwcore.InFlight:
		st := status.New(codes.Aborted, "grpcmw: a call with this key is still running; retry later to get its response")
		if d, derr := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(after)}); derr == nil {
			st = d
		}
		return st.Err()
	case mwcore.Mismatch:
		return status.Error(codes.FailedPrecondition, "grpcmw: this key was used for a different request")
	case mwcore.InvalidKey:
		return status.Errorf(codes.InvalidArgument, "grpcmw: %v", err)
	case mwcore.CorruptRecord:
		return status.Error(codes.Internal, "grpcmw: the stored record of this key cannot be read; an operator can delete it (oncectl record delete)")
	case mwcore.Canceled:
		return status.FromContextError(ctx.Err()).Err()
	case mwcore.FailOpen:
		return nil
	default:
		return status.Error(codes.Unavailable, "grpcmw: the idempotency store cannot be reached; the call was not run. Retry with the same key")
	}
}

func (s *server) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if !s.selected(info.FullMethod) {
		return handler(srv, ss)
	}
	ctx := ss.Context()
	key, ok, err := s.key(ctx, nil)
	switch {
	case err != nil:
		return err
	case !ok && s.cfg.optional:
		return handler(srv, ss)
	case !ok:
		return status.Errorf(codes.InvalidArgument, "grpcmw: %s needs an %s", info.FullMethod, s.cfg.metadataKey)
	}
	stored, err := s.stored(ctx, info.FullMethod, key, nil)
	if err != nil {
		return err
	}
	ctx = s.cfg.common.Context(ctx)
	var handlerErr error
	ran := false
	// Lock only: the claim is held while the stream runs and dropped when
	// it ends (the run never stores), so the next stream with the key runs.
	_, _, err = s.guard.Do(ctx, stored.String(), idem.Fingerprint([]byte(info.FullMethod)),
		func(rctx context.Context) ([]byte, error) {
			ran = true
			handlerErr = handler(srv, &wrappedStream{ServerStream: ss, ctx: rctx})
			return nil, errNotStored{errStreamDone}
		})
	if ran {
		return handlerErr
	}
	if err2 := s.guardError(ctx, err); err2 != nil {
		return err2
	}
	return handler(srv, ss)
}

var errStreamDone = errors.New("stream ended")

// wrappedStream gives the handler the run's context (fence, key).
type wrappedStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (w *wrappedStream) Context() context.Context { return w.ctx }
