package httpmw_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/go-chi/chi/v5"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/httpmw"
	"github.com/oncekit/oncekit/storage/memstore"
)

// An order endpoint behind a chi router: the retry of a request gets the
// first response back, marked as replayed, and the handler runs once.
func Example() {
	store := memstore.New() // or redisstore, redlockstore, etcdstore, sqlstore, zkstore
	guard, err := idem.NewGuard(store)
	if err != nil {
		panic(err)
	}
	mw, err := httpmw.New(guard,
		// One customer can never replay another's response.
		httpmw.WithScope(func(r *http.Request) string { return r.Header.Get("X-Customer") }))
	if err != nil {
		panic(err)
	}

	orders := 0
	r := chi.NewRouter()
	r.With(mw).Post("/orders", func(w http.ResponseWriter, r *http.Request) { // per route
		orders++
		fence, _ := httpmw.Fence(r.Context()) // for fenced writes
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order":%d,"fenced":%t}`, orders, fence > 0)
	})

	for range 2 { // a client retrying after a timeout
		req := httptest.NewRequest("POST", "/orders", strings.NewReader(`{"sku":"phone-x"}`))
		req.Header.Set("Idempotency-Key", "3f9a1c2e-order")
		req.Header.Set("X-Customer", "alice")
		w := httptest.NewRecorder()
		r.ServeHTTP(w, req)
		fmt.Println(w.Code, w.Body.String(), "replayed:", w.Header().Get("Idempotent-Replayed") == "true")
	}
	fmt.Println("orders placed:", orders)
	// Output:
	// 201 {"order":1,"fenced":true} replayed: false
	// 201 {"order":1,"fenced":true} replayed: true
	// orders placed: 1
}
