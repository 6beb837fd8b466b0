package inventory_test

import (
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/oncekit/oncekit/examples/inventory"
)

// A replica on the embedded store: stock an item, then order it twice with
// one Idempotency-Key — the second answer is the first, replayed — and once
// more with another key, which finds it sold out.
func Example() {
	store, backend, closeStore, err := inventory.Open("memory://", "shop:", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer closeStore()
	svc, err := inventory.New(inventory.Config{Store: store, Backend: backend})
	if err != nil {
		log.Fatal(err)
	}
	h, err := svc.Handler()
	if err != nil {
		log.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()

	send := func(method, path, key, body string) {
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
		fmt.Println(strings.TrimSpace(fmt.Sprintln(method, path, resp.StatusCode, resp.Header.Get("Idempotent-Replayed"))))
	}
	send("PUT", "/v1/items/phone", "", `{"stock":1}`)
	send("POST", "/v1/orders", "order-1", `{"sku":"phone","qty":1,"user":"ann"}`)
	send("POST", "/v1/orders", "order-1", `{"sku":"phone","qty":1,"user":"ann"}`)
	send("POST", "/v1/orders", "order-2", `{"sku":"phone","qty":1,"user":"bob"}`)
	// Output:
	// PUT /v1/items/phone 200
	// POST /v1/orders 201
	// POST /v1/orders 201 true
	// POST /v1/orders 409
}
