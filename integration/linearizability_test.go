package integration_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// The inventory's HTTP API, driven by concurrent clients across three
// replicas while one is killed, must be linearizable against a sequential
// model of the inventory in which an order key executes at most once: every
// answer is explained by some order of the operations consistent with
// real time. An answer the client never got (a replica died, a 5xx) may or
// may not have happened.
func TestLinearizable(t *testing.T) {
	eachStore(t, func(t *testing.T, url string) {
		d := deploy(t, url, 3)
		h := &history{sku: fmt.Sprintf("lin-%d", time.Now().UnixNano())}
		if out := h.restock(d.httpTargets[0], 0, 40); out.unknown {
			t.Fatal("could not stock the item")
		}
		// 8 clients × 25 operations: the checker's search grows
		// exponentially with the history's concurrency and length, and
		// 320 operations with a few unknown outcomes ran past its budget on
		// a loaded two-core CI machine.
		const clients, opsPerClient = 8, 25
		var done atomic.Int64
		var wg sync.WaitGroup
		for c := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				h.client(c, d.httpTargets, opsPerClient, &done)
			}()
		}
		// Kill a replica a third of the way through.
		for done.Load() < clients*opsPerClient/3 {
			time.Sleep(time.Millisecond)
		}
		d.replicas[2].kill()
		wg.Wait()

		ops := h.operations()
		res, info := porcupine.CheckOperationsVerbose(inventoryModel, ops, 4*time.Minute)
		t.Logf("%d operations (%d orders, %d unknown outcomes): %s", len(ops), h.orders.Load(), h.unknowns.Load(), res)
		if res != porcupine.Ok {
			path := filepath.Join(os.TempDir(), fmt.Sprintf("oncekit-linearizability-%d.html", time.Now().UnixNano()))
			if err := porcupine.VisualizePath(inventoryModel, info, path); err == nil {
				t.Logf("visualization: %s", path)
			}
			t.Fatalf("history is %s", res)
		}
	})
}

type opKind int

const (
	opOrder opKind = iota
	opRead
	opRestock
)

type input struct {
	kind  opKind
	key   string // order
	stock int64  // restock
}

type output struct {
	unknown  bool   // no answer: it may or may not have happened
	inFlight bool   // 409 request_in_flight: this request did nothing
	created  string // order: the order ID
	soldOut  bool   // order
	stock    int64  // read
	sold     int64  // read
}

type history struct {
	sku      string
	mu       sync.Mutex
	ops      []porcupine.Operation
	orders   atomic.Int64
	unknowns atomic.Int64
}

var httpClient = &http.Client{Timeout: 15 * time.Second}

func (h *history) add(client int, in input, call int64, out output) {
	if out.unknown {
		h.unknowns.Add(1)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	ret := time.Now().UnixNano()
	if out.unknown {
		ret = 1<<62 - int64(len(h.ops)) // it may have taken effect at any time after its call
	}
	h.ops = append(h.ops, porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret})
}

func (h *history) operations() []porcupine.Operation {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]porcupine.Operation(nil), h.ops...)
}

// client runs ops operations from one user: mostly orders (some of them a
// retry of an earlier key), some reads, a few restocks.
func (h *history) client(id int, targets []string, ops int, done *atomic.Int64) {
	var keys []string
	for i := range ops {
		target := targets[rand.N(len(targets))]
		switch p := rand.Float64(); {
		case p < 0.05:
			h.restock(target, id, 5+rand.Int64N(10))
		case p < 0.25:
			h.read(target, id)
		default:
			key := fmt.Sprintf("c%d-k%d", id, i)
			if len(keys) > 0 && rand.Float64() < 0.25 {
				key = keys[rand.N(len(keys))] // a retry of an earlier order
			} else {
				keys = append(keys, key)
			}
			h.order(target, targets, id, key)
		}
		done.Add(1)
	}
}

// order places one logical order with key, as a client of an idempotent
// API does: when it hears no answer (a replica died) or hears that the
// key's first attempt is still running, it retries with the same key on
// any replica. The attempts are one operation, from the first call to the
// last answer: the key runs at most once, somewhere in that span, and the
// last answer reports it. A key whose first attempt died with its replica
// stays in flight until its claim's TTL (the Guard's default, 10 s) runs
// out; the client keeps asking until then, so that its order ends known
// (placed by the retry, or sold out) rather than unknown: every unknown
// outcome overlaps the rest of the history, and a few of them make the
// checker's search blow up. Only when no attempt is answered is the
// outcome unknown.
func (h *history) order(target string, targets []string, client int, key string) output {
	h.orders.Add(1)
	in := input{kind: opOrder, key: key}
	call := time.Now().UnixNano()
	inFlightUntil := time.Now().Add(10*time.Second + 5*time.Second) // a dead replica's claim runs out by then
	var out output
	started := false
	for try := 0; ; try++ {
		if try > 0 {
			time.Sleep(min(time.Duration(try)*20*time.Millisecond, 500*time.Millisecond))
			target = targets[rand.N(len(targets))]
		}
		var reached bool
		out, reached = h.attempt(target, client, key)
		if !reached && !started {
			call = time.Now().UnixNano() // nothing reached a replica yet: the order starts later
			if try < 4 {
				continue
			}
			break
		}
		started = true
		if !out.unknown && !out.inFlight {
			break
		}
		if time.Now().After(inFlightUntil) {
			break
		}
	}
	if !started {
		return out // no attempt reached a replica: not an operation at all
	}
	if out.inFlight {
		out = output{unknown: true} // its first attempt may still run
	}
	h.add(client, in, call, out)
	return out
}

// attempt sends one attempt of an order; reached is false when the request
// never reached a replica (its connection was refused).
func (h *history) attempt(target string, client int, key string) (out output, reached bool) {
	body := fmt.Sprintf(`{"sku":%q,"qty":1,"user":"client-%d"}`, h.sku, client)
	req, _ := http.NewRequest(http.MethodPost, target+"/v1/orders", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", h.sku+"-"+key)
	out = output{unknown: true}
	resp, err := send(req)
	if refused(err) {
		return out, false
	}
	if err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var p struct {
			Code    string `json:"code"`
			OrderID string `json:"order_id"`
		}
		_ = json.Unmarshal(b, &p)
		switch {
		case resp.StatusCode == http.StatusCreated:
			out = output{created: p.OrderID}
		case resp.StatusCode == http.StatusConflict && p.Code == "sold_out":
			out = output{soldOut: true}
		case resp.StatusCode == http.StatusConflict && p.Code == "request_in_flight":
			out = output{inFlight: true}
		}
	}
	return out, true
}

// send sends req once. net/http's Transport sends a request again on a
// new connection when the connection it reused breaks before an answer,
// if the request is replayable: a GET, or a POST with an Idempotency-Key.
// When a replica was killed mid-request, that second try was refused, and
// the order looked as if it had never reached a replica, while the first
// try had run it there (a sale outside the operation's interval, which
// made the history Illegal). A body that cannot be rewound turns the retry
// off: the client's own retries, with the same key, are the ones recorded.
func send(req *http.Request) (*http.Response, error) {
	req.GetBody = nil
	return httpClient.Do(req)
}

// refused reports a request that never reached a server (its connection
// was refused, and send made no earlier try): it cannot have had an effect.
func refused(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }

func (h *history) read(target string, client int) {
	call := time.Now().UnixNano()
	out := output{unknown: true}
	if resp, err := httpClient.Get(target + "/v1/items/" + h.sku); err == nil {
		var it struct{ Stock, Sold int64 }
		if resp.StatusCode == http.StatusOK && json.NewDecoder(resp.Body).Decode(&it) == nil {
			out = output{stock: it.Stock, sold: it.Sold}
		}
		resp.Body.Close()
	}
	if out.unknown {
		return // a read with no answer constrains nothing
	}
	h.add(client, input{kind: opRead}, call, out)
}

func (h *history) restock(target string, client int, stock int64) output {
	call := time.Now().UnixNano()
	req, _ := http.NewRequest(http.MethodPut, target+"/v1/items/"+h.sku, strings.NewReader(fmt.Sprintf(`{"stock":%d}`, stock)))
	req.Header.Set("Content-Type", "application/json")
	out := output{unknown: true}
	resp, err := send(req)
	if refused(err) {
		return out
	}
	if err == nil {
		if resp.StatusCode == http.StatusOK {
			out = output{}
		}
		resp.Body.Close()
	}
	h.add(client, input{kind: opRestock, stock: stock}, call, out)
	return out
}

// state is the sequential inventory: one item, and the outcome of every
// order key that executed ("" created... the order ID, or "sold_out").
type state struct {
	stock, sold int64
	orders      map[string]string
}

func (s state) with(key, outcome string, stock, sold int64) state {
	orders := make(map[string]string, len(s.orders)+1)
	for k, v := range s.orders {
		orders[k] = v
	}
	orders[key] = outcome
	return state{stock: stock, sold: sold, orders: orders}
}

var inventoryModel = (&porcupine.NondeterministicModel{
	Init: func() []any { return []any{state{orders: map[string]string{}}} },
	Step: func(st, in, out any) []any {
		s, i, o := st.(state), in.(input), out.(output)
		switch i.kind {
		case opRead:
			if s.stock == o.stock && s.sold == o.sold {
				return []any{s}
			}
			return nil
		case opRestock:
			applied := state{stock: i.stock, orders: s.orders}
			if o.unknown {
				return []any{s, applied}
			}
			return []any{applied}
		}
		// An order. Executed at most once per key: a known key replays its
		// first outcome.
		if o.inFlight {
			return []any{s}
		}
		prev, seen := s.orders[i.key]
		if seen {
			switch {
			case o.unknown:
				return []any{s}
			case o.soldOut && prev == "sold_out", o.created != "" && prev == "created":
				return []any{s}
			}
			return nil
		}
		var executed state
		if s.stock >= 1 {
			executed = s.with(i.key, "created", s.stock-1, s.sold+1)
		} else {
			executed = s.with(i.key, "sold_out", s.stock, s.sold)
		}
		switch {
		case o.unknown:
			return []any{s, executed}
		case o.created != "" && s.stock >= 1, o.soldOut && s.stock < 1:
			return []any{executed}
		}
		return nil
	},
	Equal: func(a, b any) bool {
		x, y := a.(state), b.(state)
		if x.stock != y.stock || x.sold != y.sold || len(x.orders) != len(y.orders) {
			return false
		}
		for k, v := range x.orders {
			if y.orders[k] != v {
				return false
			}
		}
		return true
	},
	Hash: func(a any) uint64 {
		s := a.(state)
		keys := make([]string, 0, len(s.orders))
		for k, v := range s.orders {
			keys = append(keys, k+"="+v)
		}
		sort.Strings(keys)
		f := fnv.New64a()
		fmt.Fprintf(f, "%d/%d/%s", s.stock, s.sold, strings.Join(keys, ","))
		return f.Sum64()
	},
	DescribeOperation: func(in, out any) string {
		i, o := in.(input), out.(output)
		switch i.kind {
		case opRead:
			return fmt.Sprintf("read → %d left, %d sold", o.stock, o.sold)
		case opRestock:
			return fmt.Sprintf("restock %d → %s", i.stock, map[bool]string{true: "?", false: "ok"}[o.unknown])
		}
		switch {
		case o.unknown:
			return "order " + i.key + " → ?"
		case o.inFlight:
			return "order " + i.key + " → in flight"
		case o.soldOut:
			return "order " + i.key + " → sold out"
		}
		return "order " + i.key + " → " + o.created
	},
	DescribeState: func(a any) string {
		s := a.(state)
		return fmt.Sprintf("%d left, %d sold, %d keys", s.stock, s.sold, len(s.orders))
	},
}).ToModel()
