package httpmw

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/observe"
	"github.com/oncekit/oncekit/internal/mwcore"
)

// New returns middleware that makes the covered requests idempotent with
// guard: the first request with a key runs the handler and its response is
// stored; duplicates get the stored response replayed. See the package
// documentation for the rules. It fails on a nil Guard or bad options.
func New(guard *idem.Guard, opts ...Option) (func(http.Handler) http.Handler, error) {
	c := &config{
		methods:     []string{http.MethodPost, http.MethodPatch},
		header:      DefaultHeader,
		maxBody:     DefaultMaxBody,
		maxResponse: DefaultMaxResponse,
		replay:      map[string]bool{},
		fingerprint: DefaultFingerprint,
	}
	for _, h := range DefaultReplayHeaders {
		c.replay[http.CanonicalHeaderKey(h)] = true
	}
	for _, o := range opts {
		o(c)
	}
	c.errs = append(c.errs, c.common.Check())
	if c.final == nil {
		c.final, c.finalDefault = DefaultFinal, true
	}
	if guard == nil {
		c.errs = append(c.errs, errors.New("nil Guard"))
	}
	if err := errors.Join(c.errs...); err != nil {
		return nil, fmt.Errorf("httpmw: New: %w", err)
	}
	m := &middleware{cfg: c, guard: guard, observer: guard.Observer(), driver: guard.DriverName()}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { m.serve(w, r, next) })
	}, nil
}

type middleware struct {
	cfg      *config
	guard    *idem.Guard
	observer observe.Observer
	driver   string
}

// errNotStored is what the run returns for a response that must not be
// stored: the Guard abandons the claim, so a retry runs again.
type errNotStored struct{ why string }

func (e errNotStored) Error() string { return "response not stored: " + e.why }

func (m *middleware) routeOf(r *http.Request) string {
	if m.cfg.route != nil {
		return m.cfg.route(r)
	}
	if r.Pattern != "" {
		return r.Pattern
	}
	return r.Method
}

// OpRequest is the observe.Op of one request through the middleware: its
// Route is the route pattern, its Outcome one of the handler's (Executed,
// Replayed, InFlight, Mismatch, Invalid, Error, ...).
const OpRequest observe.Op = "http.request"

// httpRequest marks the middleware's events: a request answered.
var httpRequest = observe.Request{Attrs: []observe.Attr{{Key: "network.protocol.name", Value: "http"}}}

func (m *middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	if !slices.Contains(m.cfg.methods, r.Method) {
		next.ServeHTTP(w, r)
		return
	}
	ctx, call := observe.BeginEvent(r.Context(), m.observer, observe.Event{Op: OpRequest, Driver: m.driver, Request: &httpRequest})
	call.Route(m.routeOf(r))
	outcome, err := m.handle(ctx, w, r, next)
	call.End(outcome, 0, err)
}

func (m *middleware) handle(ctx context.Context, w http.ResponseWriter, r *http.Request, next http.Handler) (observe.Outcome, error) {
	values := r.Header.Values(m.cfg.header)
	var (
		key  string
		body []byte
		err  error
	)
	switch {
	case len(values) > 1:
		writeProblem(w, http.StatusBadRequest, CodeKeyInvalid,
			fmt.Sprintf("The request carries %d %s headers; send one.", len(values), m.cfg.header), 0)
		return observe.Invalid, nil
	case len(values) == 1:
		if key, err = ParseKey(values[0]); err != nil {
			writeProblem(w, http.StatusBadRequest, CodeKeyInvalid, fmt.Sprintf("%s: %v.", m.cfg.header, err), 0)
			return observe.Invalid, nil
		}
	case m.cfg.extract != nil:
		if body, err = m.readBody(r); err != nil {
			return bodyProblem(w, err)
		}
		r.Body = rewind(r.Body, body)
		extracted, found := m.cfg.extract(r)
		r.Body = rewind(r.Body, body) // the extractor may have read it
		if found {
			if err := idemdriver.CheckClientKey(extracted); err != nil {
				writeProblem(w, http.StatusBadRequest, CodeKeyInvalid, fmt.Sprintf("The request's idempotency key: %v.", err), 0)
				return observe.Invalid, nil
			}
			key = extracted
		}
	}
	if key == "" {
		if m.cfg.optional {
			next.ServeHTTP(w, r)
			return observe.Executed, nil
		}
		writeProblem(w, http.StatusBadRequest, CodeKeyMissing,
			fmt.Sprintf("%s %s needs an %s header.", r.Method, r.URL.Path, m.cfg.header), 0)
		return observe.Invalid, nil
	}
	if body == nil {
		if body, err = m.readBody(r); err != nil {
			return bodyProblem(w, err)
		}
	}
	stored, fp, outcome, err := m.storedKey(w, r, key, body)
	if stored.IsZero() {
		return outcome, err
	}
	ctx = m.cfg.common.Context(ctx)

	ran := false
	var rec *recorder
	result, replayed, err := m.guard.Do(idemdriver.ClaimOutlivesCaller(idemdriver.AnswersOnReturn(ctx)), stored.String(), fp, func(rctx context.Context) ([]byte, error) {
		ran = true
		rec = &recorder{ResponseWriter: w, allowed: m.cfg.replay, limit: m.cfg.maxResponse, runCtx: rctx}
		req := r.WithContext(rctx)
		next.ServeHTTP(rec, req)
		final := m.cfg.final
		if m.cfg.finalDefault {
			final = nil
		}
		return rec.result(req, final)
	})
	switch {
	case ran && rec.buffered:
		return m.settleHeld(w, rec, err)
	case ran:
		// The handler answered the client itself; whether its response was
		// stored only matters to later duplicates.
		return observe.Executed, err
	case err == nil && replayed:
		resp, derr := decodeResponse(result)
		if derr != nil {
			writeProblem(w, http.StatusInternalServerError, CodeRecordCorrupt,
				"The stored response of this key cannot be read; an operator can delete it (oncectl record delete).", 0)
			return observe.Error, derr
		}
		m.replay(w, resp)
		return observe.Replayed, nil
	case replayed:
		// A stored final error: the Guard was configured to store run
		// errors (idem.WithFinalErrors), which httpmw never returns.
		writeProblem(w, http.StatusInternalServerError, CodeRecordCorrupt,
			"The stored record of this key is not an HTTP response; an operator can delete it (oncectl record delete).", 0)
		return observe.Error, err
	}
	return m.refused(ctx, w, r, next, err)
}

// storedKey is the key a request's record is stored under — its key
// scoped and placed — and its fingerprint; when it cannot be made, the
// zero Key, with the problem written and the outcome to report.
func (m *middleware) storedKey(w http.ResponseWriter, r *http.Request, key string, body []byte) (stored idemdriver.Key, fp string, _ observe.Outcome, _ error) {
	r.Body = rewind(r.Body, body)
	fp, err := m.cfg.fingerprint(r, body)
	r.Body = rewind(r.Body, body) // the fingerprint may have read it
	if err != nil {
		writeProblem(w, http.StatusBadRequest, CodeBodyInvalid, fmt.Sprintf("The request cannot be told apart from others with its key: %v.", err), 0)
		return idemdriver.Key{}, "", observe.Invalid, nil
	}
	scope := ""
	if m.cfg.scope != nil {
		scope = m.cfg.scope(r)
		r.Body = rewind(r.Body, body) // the scope may have read it
		if scope == "" {
			// An empty scope would put the request into the key space every
			// unscoped request shares: one principal's key could replay to
			// another. A server fault, not the client's.
			writeProblem(w, http.StatusInternalServerError, CodeScopeEmpty,
				"The server could not tell whose request this is (its idempotency scope is empty).", 0)
			return idemdriver.Key{}, "", observe.Invalid, errors.New("httpmw: the scope function returned an empty scope; return the principal, or use Unscoped")
		}
	}
	place := ""
	if m.cfg.place != nil {
		place = m.cfg.place(r)
		r.Body = rewind(r.Body, body) // the placement may have read it
	}
	stored, err = idemdriver.StoredKey(scope, "", key, place)
	if err != nil {
		writeProblem(w, http.StatusBadRequest, CodeKeyInvalid, fmt.Sprintf("The request cannot be placed: %v.", err), 0)
		return idemdriver.Key{}, "", observe.Invalid, nil
	}
	return stored, fp, "", nil
}

// refused answers a request the Guard did not run (err says why): in
// flight, a reused key, an invalid key, a corrupt record, a client gone,
// a store down (or, with WithFailOpen, run without the Guard).
func (m *middleware) refused(ctx context.Context, w http.ResponseWriter, r *http.Request, next http.Handler, err error) (observe.Outcome, error) {
	switch refusal, after := m.cfg.common.Refused(ctx, err); refusal {
	case mwcore.InFlight:
		writeProblem(w, http.StatusConflict, CodeInFlight,
			"A request with this key is still being processed; retry later to get its response.", max(1, int(math.Ceil(after.Seconds()))))
		return observe.InFlight, nil
	case mwcore.Mismatch:
		writeProblem(w, http.StatusUnprocessableEntity, CodeKeyReused,
			"This key was used for a different request (method, path, query or body).", 0)
		return observe.Mismatch, nil
	case mwcore.InvalidKey:
		writeProblem(w, http.StatusBadRequest, CodeKeyInvalid, "The idempotency key is out of bounds: "+err.Error()+".", 0)
		return observe.Invalid, nil
	case mwcore.CorruptRecord:
		writeProblem(w, http.StatusInternalServerError, CodeRecordCorrupt,
			"The stored record of this key cannot be read; an operator can delete it (oncectl record delete).", 0)
		return observe.Error, err
	case mwcore.Canceled:
		return observe.Canceled, err // the client is gone
	case mwcore.FailOpen:
		next.ServeHTTP(w, r)
		return observe.Error, err
	default:
		writeProblem(w, http.StatusServiceUnavailable, CodeStoreDown,
			"The idempotency store cannot be reached; the request was not processed. Retry with the same key.", 1)
		return observe.Error, err
	}
}

// settleHeld answers a request whose handler committed an effect (Commit):
// its held response once the effect and the record committed together, or
// an error saying nothing was done. A response that could not be stored
// (over WithMaxResponse, not final, a stream) was not committed, and so
// neither was its effect: a success is then never passed on, since the
// client would take it for done; an error response is, as it says nothing
// was done either.
func (m *middleware) settleHeld(w http.ResponseWriter, rec *recorder, err error) (observe.Outcome, error) {
	var refused *idem.EffectRefusedError
	var notStored errNotStored
	switch {
	case err == nil:
		rec.release() // the effect and the record committed together
		return observe.Executed, nil
	case errors.As(err, &notStored) && rec.status >= 400:
		rec.release() // an error answer, and nothing was done: true as it stands
		return observe.Executed, err
	case errors.As(err, &notStored), mwcore.UnsettledBy(err) == mwcore.NotCommitted:
		clear(w.Header())
		writeProblem(w, http.StatusInternalServerError, CodeEffectNotCommitted,
			"The request's response could not be stored ("+notCommittedReason(err)+"), so its effect was not applied; nothing was done.", 0)
		return observe.Error, err
	case errors.As(err, &refused):
		clear(w.Header())
		writeProblem(w, http.StatusConflict, CodeEffectRefused,
			"The request's effect was refused ("+refused.Reason+"); nothing was done.", 0)
		return observe.Executed, err
	default:
		clear(w.Header())
		writeProblem(w, http.StatusServiceUnavailable, CodeStoreDown,
			"The request's effect and response could not be committed; nothing was done. Retry with the same key.", 1)
		return observe.Error, err
	}
}

// notCommittedReason says why a held response and its effect were not
// committed, for the client's problem detail.
func notCommittedReason(err error) string {
	var notStored errNotStored
	switch {
	case errors.As(err, &notStored):
		return notStored.why
	case errors.Is(err, idem.ErrResultTooLarge):
		return "the response is over the store's limit"
	}
	return "the store refused the effect"
}

// Commit makes the handler's effect commit atomically with the stored
// response: effect (of the store driver's type: redisstore.Effect,
// etcdstore.Effect, memstore.Effect) is applied in the same script or
// transaction that stores the response, and the response is held back
// until that commit. If it commits, the client gets the response; if the
// effect refuses (its own check failed), the client gets 409
// effect_refused; if the store fails, 503 store_unavailable; if the
// response cannot be stored (over WithMaxResponse, not final under
// WithFinal, flushed as a stream) or the effect fails in the store, 500
// effect_not_committed, unless the handler's own response was an error
// (status 400 or above), which is then passed on. In every case but the
// first nothing was done and a retry runs the handler again. Call it before
// writing the response.
// A replica that dies mid-request leaves neither the effect nor the
// record, so the retry applies the effect once.
func Commit(w http.ResponseWriter, effect any) error {
	for {
		switch v := w.(type) {
		case *recorder:
			if v.status != 0 {
				return errors.New("httpmw: Commit after the response was written")
			}
			if err := idem.Commit(v.runCtx, effect); err != nil {
				return err
			}
			v.buffered = true
			return nil
		case interface{ Unwrap() http.ResponseWriter }:
			w = v.Unwrap()
		default:
			return errors.New("httpmw: Commit outside the middleware")
		}
	}
}

// bodyProblem answers a request whose body could not be read.
func bodyProblem(w http.ResponseWriter, err error) (observe.Outcome, error) {
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		writeProblem(w, http.StatusRequestEntityTooLarge, CodeBodyTooLarge,
			fmt.Sprintf("The request body is over %d bytes, the most an idempotent request may carry.", tooLarge.Limit), 0)
		return observe.Invalid, nil
	}
	// The client went away or sent a broken body (a bad chunked encoding):
	// usually nobody reads the answer.
	writeProblem(w, http.StatusBadRequest, CodeBodyUnreadable, "The request body could not be read: "+err.Error()+".", 0)
	return observe.Invalid, err
}

func (m *middleware) readBody(r *http.Request) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	if r.ContentLength > m.cfg.maxBody {
		return nil, &http.MaxBytesError{Limit: m.cfg.maxBody}
	}
	limit := m.cfg.maxBody
	if limit < math.MaxInt64 {
		limit++ // one byte more tells an over-long body
	}
	b, err := readLimit(r.Body, limit, r.ContentLength)
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > m.cfg.maxBody {
		return nil, &http.MaxBytesError{Limit: m.cfg.maxBody}
	}
	return b, r.Body.Close()
}

// result turns the recorded response into the stored bytes, or errNotStored.
// A nil final is DefaultFinal, which reads no header (none is copied for it).
func (r *recorder) result(req *http.Request, final func(*http.Request, int, http.Header) bool) ([]byte, error) {
	if r.status == 0 {
		r.WriteHeader(http.StatusOK) // the handler wrote nothing: an implicit 200 with its headers
	}
	switch {
	case r.hijacked:
		return nil, errNotStored{"the handler hijacked the connection"}
	case r.streamed:
		return nil, errNotStored{"the handler flushed a stream"}
	case r.overflow:
		return nil, errNotStored{"the response body is over the limit"}
	case r.status >= 500:
		return nil, errNotStored{fmt.Sprintf("status %d", r.status)}
	case !r.final && final == nil && !DefaultFinal(req, r.status, nil):
		return nil, errNotStored{fmt.Sprintf("status %d is not final", r.status)}
	case !r.final && final != nil && !final(req, r.status, r.ResponseWriter.Header().Clone()):
		return nil, errNotStored{fmt.Sprintf("status %d is not final", r.status)}
	}
	return response{status: r.status, fields: r.fields, body: r.body.Bytes()}.encode(), nil
}

// replay writes a stored response. Its headers are filtered again through
// the allowlist: a record written by an older version or another
// configuration never replays a header this one would not store.
func (m *middleware) replay(w http.ResponseWriter, resp response) {
	h := w.Header()
	prev := ""
	for i := 0; i+1 < len(resp.fields); i += 2 {
		k := http.CanonicalHeaderKey(resp.fields[i])
		if !m.cfg.replay[k] || slices.Contains(forbidden, k) {
			continue
		}
		if k == prev {
			h[k] = append(h[k], resp.fields[i+1])
		} else {
			// The stored values replace the name's: the first one as a
			// slice of the record's own (its capacity capped, so that
			// an append copies), with no allocation.
			h[k] = resp.fields[i+1 : i+2 : i+2]
		}
		prev = k
	}
	h.Set(ReplayedHeader, "true")
	h.Set("Content-Length", strconv.Itoa(len(resp.body)))
	w.WriteHeader(resp.status)
	_, _ = w.Write(resp.body)
}

// Fence returns the fence of the idempotency claim the request runs under,
// from the handler's request context: pass it to the writes the handler
// makes so that a run whose claim was lost cannot overwrite a newer one.
func Fence(ctx context.Context) (uint64, bool) { return idem.FenceFrom(ctx) }

// Key returns the stored key of the request's claim (the
// same on every retry of the request) from the handler's request context:
// key an effect outside the idempotency store on it (a unique column, a
// conditional write) so that a retry after a crash between the effect and
// the stored response finds the effect done. See idem.KeyFrom.
func Key(ctx context.Context) (string, bool) { return idem.KeyFrom(ctx) }

// bodyReader is the request body the middleware read, given to whoever
// reads it next (an extractor, the fingerprint, the scope, the handler).
type bodyReader struct{ bytes.Reader }

func (*bodyReader) Close() error { return nil }

// rewind returns a body that reads body from its start: cur itself,
// rewound, when it is the middleware's own (no allocation each time).
func rewind(cur io.ReadCloser, body []byte) io.ReadCloser {
	b, ok := cur.(*bodyReader)
	if !ok {
		b = new(bodyReader)
	}
	b.Reset(body)
	return b
}

// readLimit reads r to its end or to limit bytes, into one buffer when
// size (the Content-Length, -1 when unknown) is right.
func readLimit(r io.Reader, limit, size int64) ([]byte, error) {
	n := int64(512)
	if size >= 0 {
		n = size + 1 // (the end is a read of 0 bytes into the spare one)
	}
	b := make([]byte, 0, min(n, limit))
	for int64(len(b)) < limit {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)] // grow
		}
		room := b[len(b):min(int64(cap(b)), limit)]
		k, err := r.Read(room)
		b = b[:len(b)+k]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
	}
	return b, nil
}
