package inventory

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/lock"
	"github.com/oncekit/oncekit/httpmw"
	"github.com/oncekit/oncekit/kafkamw"
)

// Store is what the service needs of an oncekit driver: every driver is
// both.
type Store interface {
	lock.Locker
	idemdriver.Store
}

// Config wires a Service.
type Config struct {
	Store   Store
	Backend Backend
	// Gatherer serves /metrics (nil: an empty registry).
	Gatherer prometheus.Gatherer
	// LockTTL is the SKU lock's TTL, kept alive while held (default 5 s).
	LockTTL time.Duration
	// Wait is how long a duplicate of an order in flight waits for its
	// answer before it gets 409 request_in_flight (default 5 s).
	Wait time.Duration
	// SKULocker takes the per-SKU lock (default: Store). A Locker whose
	// leases carry no fence (Fence 0: a peer library's, for comparison)
	// makes sales unfenced.
	SKULocker lock.Locker
	// LockFree sells without the SKU lock. Package stock takes the units
	// in one atomic step of the store, never below zero, so the lock adds
	// only a queue: it is kept to compare (and to show a lock's fence on
	// an order). An order's fence is then its idempotency claim's.
	LockFree bool
	// ReportEvery, when positive, makes the replicas log the sale's totals
	// (orders, shipments) at every multiple of it, once across all of them
	// whatever their clocks (job.Run): a periodic job of the inventory's own.
	ReportEvery time.Duration
	// ReportName is the report job's name, the same on every replica of one
	// inventory (default "inventory/report").
	ReportName string
	// ReportTo receives the reports (default os.Stderr).
	ReportTo io.Writer
}

// Service is one replica of the inventory: its HTTP and gRPC APIs over a
// shared Store and Backend. Any number of replicas, in one process or many,
// serve the same inventory.
type Service struct {
	backend  Backend
	store    Store
	guard    *idem.Guard
	mutex    *lock.Mutex
	gatherer prometheus.Gatherer
	wait     time.Duration
	lockFree bool
	kick     chan struct{} // an order was sold: the outbox relay has work
	relayTTL time.Duration // the relay leader's lease (Config.LockTTL)
	report   reportJob

	consumers sync.Map // *kafkamw.Consumer -> struct{}: this process's shipping consumers
	relayed   atomic.Int64
}

// New returns a replica.
func New(cfg Config) (*Service, error) {
	if cfg.Store == nil || cfg.Backend == nil {
		return nil, errors.New("inventory: New needs a Store and a Backend")
	}
	if cfg.LockTTL <= 0 {
		cfg.LockTTL = 5 * time.Second
	}
	if cfg.Wait <= 0 {
		cfg.Wait = 5 * time.Second
	}
	if cfg.Gatherer == nil {
		cfg.Gatherer = prometheus.NewRegistry()
	}
	guard, err := idem.NewGuard(cfg.Store)
	if err != nil {
		return nil, err
	}
	locker := cfg.SKULocker
	if locker == nil {
		locker = cfg.Store
	}
	mutex, err := lock.NewMutex(locker, lock.WithTTL(cfg.LockTTL), lock.WithWaitTimeout(10*time.Second))
	if err != nil {
		return nil, err
	}
	return &Service{backend: cfg.Backend, store: cfg.Store, guard: guard, mutex: mutex, gatherer: cfg.Gatherer, wait: cfg.Wait,
		lockFree: cfg.LockFree, kick: make(chan struct{}, 1), relayTTL: cfg.LockTTL,
		report: reportJob{every: cfg.ReportEvery, name: cmp.Or(cfg.ReportName, "inventory/report"), to: cmp.Or[io.Writer](cfg.ReportTo, os.Stderr)}}, nil
}

// Guard is the replica's idem.Guard (the Kafka consumer runs on it too).
func (s *Service) Guard() *idem.Guard { return s.guard }

// Backend is the inventory the replica serves.
func (s *Service) Backend() Backend { return s.backend }

// placeOrder sells qty of sku to user, once per idempotency key: the
// units are taken by package stock, keyed on the order's ID (a retry of
// the request takes nothing more), and the order and its order.created
// event are committed with the key's record through commit (httpmw.Commit,
// idem.Commit). A replica that dies between the two leaves the units taken
// and the record in flight: the client's retry finds the take done and
// records the order. Under the SKU lock (Config.LockFree false), the lock
// is released by the outer layer (holdLocks) once the record is committed;
// a refused order releases it at once.
func (s *Service) placeOrder(ctx context.Context, sku string, qty int64, user string, commit func(any) error) (Order, error) {
	if err := CheckOrder(sku, qty, user); err != nil {
		return Order{}, err
	}
	key, ok := idem.KeyFrom(ctx)
	if !ok {
		return Order{}, errors.New("inventory: an order runs under the idempotency middleware")
	}
	o := Order{OrderID: OrderID(key, sku), SKU: sku, Qty: qty, User: user, Trace: traceOf(ctx)}
	o.Fence, _ = idem.FenceFrom(ctx)
	var held lock.Held
	if !s.lockFree {
		h, err := s.mutex.Lock(ctx, "sku:"+sku)
		if err != nil {
			return Order{}, fmt.Errorf("inventory: lock sku %s: %w", sku, err)
		}
		held = h
		o.Fence = h.Fence()
	}
	committed, err := s.sell(ctx, o, commit)
	if held != nil {
		// The lock is kept until the order commits with its record; a
		// refused order (sold out) has nothing to commit and lets the SKU
		// go at once: the next buyer need not wait for this one's answer
		// to be stored.
		if committed {
			releaseLater(ctx, held)
		} else {
			releaseNow(ctx, held)
		}
	}
	if err != nil {
		return Order{}, err
	}
	select {
	case s.kick <- struct{}{}:
	default:
	}
	return o, nil
}

// sell takes o's units and records o (committed reports whether the
// order's writes were committed).
func (s *Service) sell(ctx context.Context, o Order, commit func(any) error) (committed bool, err error) {
	if err := s.backend.Take(ctx, o); err != nil {
		return false, err
	}
	effect, err := s.backend.Record(ctx, o)
	if err != nil {
		return false, err
	}
	if effect != nil {
		if err := commit(effect); err != nil {
			return false, err
		}
	}
	return true, nil
}

// placeOf is where the record of an order of sku lives (idem.Placed):
// with the SKU's stock; "" (unplaced) for an invalid SKU, which the order
// handler refuses.
func placeOf(sku string) string {
	if CheckSKU(sku) != nil {
		return ""
	}
	return sku
}

// putItem makes sku's stock (its units left to sell) stock.
func (s *Service) putItem(ctx context.Context, sku string, stock int64) (Item, error) {
	if err := CheckSKU(sku); err != nil {
		return Item{}, err
	}
	if err := CheckStock(stock); err != nil {
		return Item{}, err
	}
	return s.backend.PutItem(ctx, sku, stock)
}

// heldLocks are the locks a request took, released once its response is
// stored (holdLocks).
type heldLocks struct {
	mu   sync.Mutex
	held []lock.Held
}

type heldLocksKey struct{}

// holdLocks runs next with a place for the locks it takes, and releases
// them after next returns — for an order, after the idempotency layer
// inside next has committed the sale with its record.
func holdLocks(ctx context.Context, next func(ctx context.Context)) {
	hl := &heldLocks{}
	next(context.WithValue(ctx, heldLocksKey{}, hl))
	hl.mu.Lock()
	defer hl.mu.Unlock()
	for _, h := range hl.held {
		releaseNow(ctx, h)
	}
}

// releaseLater hands h to the request's holdLocks, or releases it at
// once outside one.
func releaseLater(ctx context.Context, h lock.Held) {
	if hl, ok := ctx.Value(heldLocksKey{}).(*heldLocks); ok {
		hl.mu.Lock()
		hl.held = append(hl.held, h)
		hl.mu.Unlock()
		return
	}
	releaseNow(ctx, h)
}

// releaseNow releases h, even when the request's ctx ended (a lease that
// could not be released runs out on its own).
func releaseNow(ctx context.Context, h lock.Held) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	_ = h.Release(rctx)
	cancel()
}

// Handler is the replica's HTTP API on a chi router.
func (s *Service) Handler() (http.Handler, error) {
	idempotent, err := httpmw.New(s.guard,
		// The principal: this demo has no authentication, so an order's
		// user is its scope, read from the body. A real service returns
		// the authenticated principal here (from its auth middleware's
		// context), so that no client can replay another's order.
		httpmw.WithScope(func(r *http.Request) string {
			var body struct {
				User string `json:"user"`
			}
			_ = json.NewDecoder(r.Body).Decode(&body)
			return "user:" + body.User
		}),
		// An order's record lives with its SKU's stock: on Redis Cluster,
		// in the SKU's slot, so that the sale commits in the record's
		// script. (An invalid SKU leaves the record unplaced; the handler
		// refuses it.)
		httpmw.WithPlacement(func(r *http.Request) string {
			var body struct {
				SKU string `json:"sku"`
			}
			_ = json.NewDecoder(r.Body).Decode(&body)
			if sku, ok := holdSKU(chi.URLParam(r, "id")); ok && body.SKU == "" {
				return placeOf(sku) // paying a hold: the SKU it names
			}
			return placeOf(body.SKU)
		}),
		httpmw.WithWait(s.wait),
		httpmw.WithRoute(func(*http.Request) string { return "/v1/orders" }))
	if err != nil {
		return nil, err
	}
	r := chi.NewRouter()
	r.Use(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			holdLocks(r.Context(), func(ctx context.Context) { next.ServeHTTP(w, r.WithContext(ctx)) })
		})
	})
	r.Get("/healthz", s.healthz)
	r.Handle("/metrics", promhttp.HandlerFor(s.gatherer, promhttp.HandlerOpts{}))
	r.Put("/v1/items/{sku}", s.httpPutItem)
	r.Get("/v1/items/{sku}", s.httpGetItem)
	r.Get("/v1/orders/{id}", s.httpGetOrder)
	r.Get("/v1/stats", s.httpStats)
	r.With(idempotent).Post("/v1/orders", s.httpPostOrder)
	r.With(idempotent).Post("/v1/holds", s.httpPostHold)
	r.With(idempotent).Post("/v1/holds/{id}/pay", s.httpPayHold)
	r.Delete("/v1/holds/{id}", s.httpDeleteHold)
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		problem(w, http.StatusNotFound, "not_found", "no such resource")
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		problem(w, http.StatusMethodNotAllowed, "method_not_allowed", r.Method+" is not allowed here")
	})
	return r, nil
}

func (s *Service) healthz(w http.ResponseWriter, r *http.Request) {
	if err := s.Healthy(r.Context()); err != nil {
		problem(w, http.StatusServiceUnavailable, "store_unavailable", err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// Healthy reports whether the replica can serve: its store answers (Ping,
// where the driver has it: every oncekit driver does) and its inventory
// can be read, within 2 s. GET /healthz and grpc.health.v1 Check answer
// with it.
func (s *Service) Healthy(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if p, ok := s.store.(interface{ Ping(context.Context) error }); ok {
		if err := p.Ping(ctx); err != nil {
			return err
		}
	}
	_, _, err := s.backend.Counts(ctx)
	return err
}

func (s *Service) httpPutItem(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Stock *int64 `json:"stock"`
	}
	if err := decode(w, r, &body); err != nil {
		return
	}
	if body.Stock == nil {
		problem(w, http.StatusBadRequest, "invalid_request", "the body needs a stock")
		return
	}
	it, err := s.putItem(r.Context(), chi.URLParam(r, "sku"), *body.Stock)
	if err != nil {
		httpError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, it)
}

func (s *Service) httpGetItem(w http.ResponseWriter, r *http.Request) {
	sku := chi.URLParam(r, "sku")
	if err := CheckSKU(sku); err != nil {
		httpError(w, err)
		return
	}
	it, err := s.backend.Item(r.Context(), sku)
	if err != nil {
		httpError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, it)
}

func (s *Service) httpGetOrder(w http.ResponseWriter, r *http.Request) {
	o, err := s.backend.Order(r.Context(), chi.URLParam(r, "id"))
	if err != nil {
		httpError(w, err)
		return
	}
	o.Trace = nil // internal: not part of the answer
	writeJSON(w, http.StatusOK, o)
}

// Stats is GET /v1/stats: how many orders were sold and shipped (all
// replicas), and what this process's outbox relay and shipping consumers
// did.
type Stats struct {
	Orders    int64         `json:"orders"`
	Shipments int64         `json:"shipments"`
	Relayed   int64         `json:"relayed"`
	Shipping  kafkamw.Stats `json:"shipping"`
}

func (s *Service) httpStats(w http.ResponseWriter, r *http.Request) {
	orders, shipments, err := s.backend.Counts(r.Context())
	if err != nil {
		httpError(w, err)
		return
	}
	st := Stats{Orders: orders, Shipments: shipments, Relayed: s.relayed.Load()}
	s.consumers.Range(func(c, _ any) bool {
		cs := c.(*kafkamw.Consumer).Stats()
		st.Shipping.Fetched += cs.Fetched
		st.Shipping.Handled += cs.Handled
		st.Shipping.Duplicates += cs.Duplicates
		st.Shipping.Retries += cs.Retries
		st.Shipping.DeadLettered += cs.DeadLettered
		st.Shipping.StoreErrors += cs.StoreErrors
		st.Shipping.Commits += cs.Commits
		st.Shipping.CommitErrors += cs.CommitErrors
		return true
	})
	writeJSON(w, http.StatusOK, st)
}

func (s *Service) httpPostOrder(w http.ResponseWriter, r *http.Request) {
	var body struct {
		SKU  string `json:"sku"`
		Qty  int64  `json:"qty"`
		User string `json:"user"`
	}
	if err := decode(w, r, &body); err != nil {
		return
	}
	o, err := s.placeOrder(r.Context(), body.SKU, body.Qty, body.User, func(effect any) error {
		return httpmw.Commit(w, effect)
	})
	if err != nil {
		if errors.Is(err, ErrSoldOut) {
			// A business answer: stored and replayed, even to a retry
			// after a restock (409 is not stored by default).
			httpmw.Final(w)
		}
		httpError(w, err)
		return
	}
	w.Header().Set("Location", "/v1/orders/"+o.OrderID)
	o.Trace = nil // internal: not part of the answer
	writeJSON(w, http.StatusCreated, o)
}

// decode reads a JSON body strictly, or answers 400.
func decode(w http.ResponseWriter, r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		problem(w, http.StatusBadRequest, "invalid_request", "the body is not the expected JSON: "+err.Error())
		return err
	}
	if dec.More() {
		problem(w, http.StatusBadRequest, "invalid_request", "the body holds more than one JSON value")
		return errors.New("trailing data")
	}
	return nil
}

// httpError answers err as a problem.
func httpError(w http.ResponseWriter, err error) {
	var refused *idem.EffectRefusedError
	switch {
	case errors.Is(err, ErrInvalid):
		problem(w, http.StatusBadRequest, "invalid_request", err.Error())
	case errors.Is(err, ErrUnknownSKU):
		problem(w, http.StatusNotFound, "unknown_sku", "no item has this sku")
	case errors.Is(err, ErrUnknownOrder):
		problem(w, http.StatusNotFound, "unknown_order", "no order has this id")
	case errors.Is(err, ErrSoldOut):
		problem(w, http.StatusConflict, "sold_out", "not enough stock")
	case errors.Is(err, ErrHoldExpired):
		problem(w, http.StatusConflict, "hold_expired", "the hold ran out before it was paid; its units are for sale again")
	case errors.Is(err, ErrUnknownHold):
		problem(w, http.StatusNotFound, "unknown_hold", "no hold has this id")
	case errors.Is(err, ErrHoldPaid):
		problem(w, http.StatusConflict, "hold_paid", "the hold was paid: it is an order now")
	case errors.As(err, &refused):
		problem(w, http.StatusConflict, "conflict", "the sale lost its claim before it committed; retry")
	case errors.Is(err, lock.ErrNotAcquired), errors.Is(err, context.DeadlineExceeded):
		problem(w, http.StatusServiceUnavailable, "busy", "the item is busy; retry")
	default:
		problem(w, http.StatusServiceUnavailable, "store_unavailable", err.Error())
	}
}

// problem writes an RFC 9457 problem+json body.
func problem(w http.ResponseWriter, status int, code, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(httpmw.Problem{
		Type: "https://oncekit.dev/problems/" + code, Title: http.StatusText(status), Status: status, Detail: detail, Code: code,
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
