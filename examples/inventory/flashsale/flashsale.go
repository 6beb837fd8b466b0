package flashsale

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/examples/inventory"
	"github.com/oncekit/oncekit/examples/inventory/inventorypb"
	"github.com/oncekit/oncekit/grpcmw"
)

// Config is one flash sale.
type Config struct {
	// Targets are the replicas' HTTP base URLs (http://host:port).
	Targets []string
	// GRPC are the replicas' gRPC addresses; when set, every other buyer
	// orders over gRPC.
	GRPC []string
	// Buyers (default 1,000) race for Stock units (default 100) of SKU
	// (default a fresh one), one unit each.
	Buyers int
	Stock  int64
	SKU    string
	// DupRate is the share of buyers who send their order twice at once,
	// to two replicas, with one key (default 0.3; negative: none).
	DupRate float64
	// Shipping waits up to this long for a shipment per order (0: the
	// service has no Kafka, do not check).
	Shipping time.Duration
	// Progress, if not nil, gets a progress bar.
	Progress io.Writer
	// Attempts bounds each buyer's tries of one request (default 30).
	Attempts int
	// Confirmed, if not nil, is called with the number of orders
	// confirmed so far each time one is (from the buyers' goroutines;
	// replays of a confirmed order are not counted again).
	Confirmed func(n int64)
	// HoldRate is the share of HTTP buyers who hold a unit first
	// (POST /v1/holds, HoldTTL) and then pay with PayRate's chance; the
	// others let their hold run out, and its unit is for sale again
	// (default 0: none).
	HoldRate, PayRate float64
	// HoldTTL is how long a hold lasts (default 2 s).
	HoldTTL time.Duration
	// AllowRefused accepts answers that refused a sale's effect (409
	// effect_refused or conflict: the sale's lock or claim was lost
	// before it committed, nothing was sold). Buyers retry them either
	// way; without AllowRefused the report fails on any, since without
	// faults every answer must be a sale or sold_out. Set it for sales
	// that pause a replica past its TTL.
	AllowRefused bool
}

// outcome of one request.
type outcome int

const (
	created outcome = iota
	soldOut
	retryable
	failed
	abandoned // a hold its buyer let run out
)

type sample struct {
	start    time.Duration // since the sale began
	latency  time.Duration
	outcome  outcome
	replayed bool
}

// answer is a buyer's final answer and its bytes (the body, or the
// deterministic encoding of a gRPC reply), for the replay check.
type answer struct {
	outcome outcome
	orderID string
	body    string
}

type run struct {
	cfg       Config
	client    *http.Client
	grpc      []inventorypb.InventoryClient
	begin     time.Time
	requests  atomic.Int64
	sold      atomic.Int64 // confirmed orders so far (Config.Confirmed)
	refused   atomic.Int64 // answers that refused a sale's effect
	holds     atomic.Int64 // buyers who held first
	paid      atomic.Int64 // of which paid
	abandoned atomic.Int64 // of which let the hold run out
	mu        sync.Mutex
	samples   []sample
	answers   map[string][]answer // key -> every final answer it got
	errs      []string
	before    struct{ Orders, Shipments int64 }
}

// Run runs the sale and returns its report; an error means the sale could
// not run at all (no replica answered), not that an invariant failed
// (Report.OK).
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if len(cfg.Targets) == 0 {
		return nil, errors.New("flashsale: no targets")
	}
	if cfg.Buyers <= 0 {
		cfg.Buyers = 1000
	}
	if cfg.Stock <= 0 {
		cfg.Stock = 100
	}
	if cfg.DupRate == 0 {
		cfg.DupRate = 0.3
	}
	if cfg.Attempts <= 0 {
		cfg.Attempts = 30
	}
	if cfg.SKU == "" {
		cfg.SKU = fmt.Sprintf("flash-%d", time.Now().UnixNano())
	}
	if cfg.HoldTTL <= 0 {
		cfg.HoldTTL = 2 * time.Second
	}
	r := &run{cfg: cfg, answers: map[string][]answer{},
		client: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 256}}}
	defer r.client.CloseIdleConnections()
	for _, addr := range cfg.GRPC {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithChainUnaryInterceptor(grpcmw.UnaryClientInterceptor()))
		if err != nil {
			return nil, err
		}
		defer conn.Close()
		r.grpc = append(r.grpc, inventorypb.NewInventoryClient(conn))
	}
	// Orders and shipments count the whole inventory: the sale's are what
	// it adds to what was there.
	if err := r.get(ctx, "/v1/stats", &r.before); err != nil {
		return nil, err
	}
	if err := r.restock(ctx); err != nil {
		return nil, err
	}

	r.begin = time.Now()
	stopProgress := r.progress()
	var wg sync.WaitGroup
	var done atomic.Int64
	sem := make(chan struct{}, 256) // buyers in flight at once
	for i := range cfg.Buyers {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem; done.Add(1) }()
			r.buyer(ctx, i)
		}()
	}
	wg.Wait()
	elapsed := time.Since(r.begin)
	stopProgress()
	return r.report(ctx, elapsed)
}

func (r *run) restock(ctx context.Context) error {
	body := fmt.Sprintf(`{"stock":%d}`, r.cfg.Stock)
	var last error
	for i := range 20 {
		target := r.cfg.Targets[i%len(r.cfg.Targets)]
		req, _ := http.NewRequestWithContext(ctx, http.MethodPut, target+"/v1/items/"+r.cfg.SKU, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := r.client.Do(req)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("PUT item: %s: %s", resp.Status, bytes.TrimSpace(b))
		}
		last = err
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("flashsale: cannot stock the item: %w", last)
}

// buyer orders one unit with one key; a duplicating buyer sends the same
// order to another replica at the same time.
func (r *run) buyer(ctx context.Context, i int) {
	key := idemdriver.NewKey()
	user := fmt.Sprintf("buyer-%d", i)
	overGRPC := len(r.grpc) > 0 && i%2 == 1
	if !overGRPC && r.cfg.HoldRate > 0 && rand.Float64() < r.cfg.HoldRate {
		a := r.holder(ctx, key, user, i, rand.Float64() < r.cfg.PayRate)
		r.mu.Lock()
		r.answers[key] = append(r.answers[key], a)
		r.mu.Unlock()
		return
	}
	send := func(replica int) {
		var a answer
		if overGRPC {
			a = r.orderGRPC(ctx, key, user, replica)
		} else {
			a = r.orderHTTP(ctx, key, user, replica)
		}
		r.mu.Lock()
		r.answers[key] = append(r.answers[key], a)
		r.mu.Unlock()
	}
	if r.cfg.DupRate > 0 && rand.Float64() < r.cfg.DupRate {
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { defer wg.Done(); send(i + 1) }()
		send(i)
		wg.Wait()
		return
	}
	send(i)
}

func (r *run) record(s sample) {
	r.mu.Lock()
	r.samples = append(r.samples, s)
	r.mu.Unlock()
	if s.outcome == created && !s.replayed && r.cfg.Confirmed != nil {
		r.cfg.Confirmed(r.sold.Add(1))
	}
}

func (r *run) fail(format string, args ...any) answer {
	r.mu.Lock()
	if len(r.errs) < 20 {
		r.errs = append(r.errs, fmt.Sprintf(format, args...))
	}
	r.mu.Unlock()
	return answer{outcome: failed}
}

// orderHTTP places the order over HTTP, retrying with the same key on
// another replica after a transient answer, and returns the final answer.
func (r *run) orderHTTP(ctx context.Context, key, user string, replica int) answer {
	body := fmt.Sprintf(`{"sku":%q,"qty":1,"user":%q}`, r.cfg.SKU, user)
	var p struct {
		OrderID string `json:"order_id"`
	}
	a := r.post(ctx, "/v1/orders", key, body, replica, &p, func(status int) bool { return status == http.StatusCreated && p.OrderID != "" }, r.record)
	a.orderID = p.OrderID
	return a
}

// holder holds one unit, then pays for it (pay) or lets the hold run out.
// Its answer is the order (created), sold_out, or — for a hold it let
// run out — abandoned.
func (r *run) holder(ctx context.Context, key, user string, replica int, pay bool) answer {
	body := fmt.Sprintf(`{"sku":%q,"qty":1,"user":%q,"ttl_ms":%d}`, r.cfg.SKU, user, r.cfg.HoldTTL.Milliseconds())
	var h struct {
		Code   string `json:"code"`
		HoldID string `json:"hold_id"`
	}
	a := r.post(ctx, "/v1/holds", key, body, replica, &h, func(status int) bool { return status == http.StatusCreated && h.HoldID != "" }, r.recordHold)
	r.holds.Add(1)
	if a.outcome != created {
		return a
	}
	if !pay {
		r.abandoned.Add(1)
		return answer{outcome: abandoned, body: a.body}
	}
	var o struct {
		Code    string `json:"code"`
		OrderID string `json:"order_id"`
	}
	a = r.post(ctx, "/v1/holds/"+h.HoldID+"/pay", key+"-pay", fmt.Sprintf(`{"user":%q}`, user), replica, &o,
		func(status int) bool { return status == http.StatusCreated && o.OrderID != "" }, r.recordHold)
	if a.outcome == created {
		a.orderID = o.OrderID
		r.paid.Add(1)
	}
	return a
}

// post sends one idempotent request until it gets a final answer: done's
// (created), sold_out (or hold_expired), or a failure; record records each
// answer's sample.
func (r *run) post(ctx context.Context, path, key, body string, replica int, v any, done func(status int) bool, record func(sample)) answer {
	var last string
	for attempt := range r.cfg.Attempts {
		target := r.cfg.Targets[(replica+attempt)%len(r.cfg.Targets)]
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, target+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		start := time.Now()
		r.requests.Add(1)
		resp, err := r.client.Do(req)
		if err != nil {
			record(sample{start: start.Sub(r.begin), latency: time.Since(start), outcome: retryable})
			last = err.Error()
			backoff(attempt)
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		s := sample{start: start.Sub(r.begin), latency: time.Since(start), replayed: resp.Header.Get("Idempotent-Replayed") == "true"}
		var p struct {
			Code string `json:"code"`
		}
		_ = json.Unmarshal(b, &p)
		_ = json.Unmarshal(b, v)
		switch {
		case done(resp.StatusCode):
			s.outcome = created
			record(s)
			return answer{outcome: created, body: string(b)}
		case resp.StatusCode == http.StatusConflict && (p.Code == "sold_out" || p.Code == "hold_expired"):
			s.outcome = soldOut
			record(s)
			return answer{outcome: soldOut, body: string(b)}
		case resp.StatusCode >= 500, resp.StatusCode == http.StatusConflict, resp.StatusCode == http.StatusTooManyRequests:
			if resp.StatusCode == http.StatusConflict && (p.Code == "effect_refused" || p.Code == "conflict") && !soldOutAtCommit(string(b)) {
				r.refused.Add(1)
			}
			s.outcome = retryable
			record(s)
			last = fmt.Sprintf("%d %s", resp.StatusCode, p.Code)
			backoff(attempt)
		default:
			s.outcome = failed
			record(s)
			return r.fail("%s %s: %s: %s", path, key, resp.Status, bytes.TrimSpace(b))
		}
	}
	return r.fail("%s %s: no final answer after %d attempts (last: %s)", path, key, r.cfg.Attempts, last)
}

// recordHold records a hold's or a payment's request: its latency, not a
// confirmed order (holder counts those once it paid).
func (r *run) recordHold(s sample) {
	r.mu.Lock()
	r.samples = append(r.samples, s)
	r.mu.Unlock()
}

// orderGRPC places the order over gRPC, the same way.
func (r *run) orderGRPC(ctx context.Context, key, user string, replica int) answer {
	var last string
	for attempt := range r.cfg.Attempts {
		c := r.grpc[(replica+attempt)%len(r.grpc)]
		var header metadata.MD
		cctx := metadata.AppendToOutgoingContext(ctx, grpcmw.DefaultMetadataKey, key, "x-user", user)
		start := time.Now()
		r.requests.Add(1)
		o, err := c.PlaceOrder(cctx, &inventorypb.PlaceOrderRequest{Sku: r.cfg.SKU, Qty: 1, User: user}, grpc.Header(&header))
		s := sample{start: start.Sub(r.begin), latency: time.Since(start),
			replayed: slices.Contains(header.Get(grpcmw.ReplayedMetadataKey), "true")}
		st := status.Convert(err)
		switch {
		case err == nil:
			s.outcome = created
			r.record(s)
			b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(o)
			return answer{outcome: created, orderID: o.GetOrderId(), body: string(b)}
		case st.Code() == codes.FailedPrecondition && reason(st) == "sold_out":
			s.outcome = soldOut
			r.record(s)
			return answer{outcome: soldOut, body: st.Message()}
		case st.Code() == codes.Unavailable, st.Code() == codes.Aborted, st.Code() == codes.DeadlineExceeded:
			if st.Code() == codes.Aborted && (reason(st) == "conflict" || strings.Contains(st.Message(), "effect was refused")) && !soldOutAtCommit(st.Message()) {
				r.refused.Add(1)
			}
			s.outcome = retryable
			r.record(s)
			last = st.String()
			backoff(attempt)
		default:
			s.outcome = failed
			r.record(s)
			return r.fail("order %s over gRPC: %v", key, st)
		}
	}
	return r.fail("order %s over gRPC: no final answer after %d attempts (last: %s)", key, r.cfg.Attempts, last)
}

// soldOutAtCommit reports a refusal whose reason is sold_out: a lock-free
// sale checks the stock, then commits the sale with its record in one
// step that checks it again, and the units may have gone in between. The
// buyer's retry gets sold_out; nothing was refused that should not be.
func soldOutAtCommit(answer string) bool {
	return strings.Contains(answer, "sold_out") || strings.Contains(answer, inventory.ErrSoldOut.Error())
}

func reason(st *status.Status) string {
	for _, d := range st.Details() {
		if info, ok := d.(interface{ GetReason() string }); ok {
			return info.GetReason()
		}
	}
	return ""
}

func backoff(attempt int) {
	d := min(10*time.Millisecond<<min(attempt, 6), 500*time.Millisecond)
	time.Sleep(d/2 + rand.N(d/2+1))
}

// progress draws a bar until the returned function is called.
func (r *run) progress() (stop func()) {
	if r.cfg.Progress == nil {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	draw := func() {
		r.mu.Lock()
		n := len(r.answers)
		r.mu.Unlock()
		const width = 40
		filled := width * n / r.cfg.Buyers
		fmt.Fprintf(r.cfg.Progress, "\r  [%s%s] %d/%d buyers answered, %d requests",
			strings.Repeat("=", filled), strings.Repeat(" ", width-filled), n, r.cfg.Buyers, r.requests.Load())
	}
	go func() {
		defer wg.Done()
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				draw()
				fmt.Fprintln(r.cfg.Progress)
				return
			case <-t.C:
				draw()
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}
