// Package inventory is oncekit's example service, the one to copy: a flash
// sale where many buyers race for little stock across replicas, over HTTP
// and gRPC, with each sale announced on Kafka and shipped once.
//
// It shows the three cases oncekit exists for:
//
//   - Stock overselling: a sale takes its units with package stock, in
//     one atomic step of the store, never below zero, once per order ID;
//     concurrent takes of one SKU in a replica travel in one store call.
//     A buyer may hold units first (POST /v1/holds) and pay within the
//     hold's time, or let it run out: its units are for sale again.
//   - Order grabbing and client retries: an order runs once per
//     Idempotency-Key (httpmw) or idempotency-key metadata (grpcmw); a
//     duplicate gets the first answer replayed byte for byte, a sold-out
//     answer included (a retry after a restock still says sold out).
//   - Duplicate consumption: every sale is announced as order.created,
//     and the shipping consumer (kafkamw) records one shipment per order
//     however often the event is delivered.
//
// # Once, across crashes
//
// The units are taken by package stock, keyed on the order's ID, which is
// derived from the idempotency record's stored key: a retry of the request
// takes nothing more. The order and its outbox entry commit in the same
// Redis script, etcd or ZooKeeper transaction or SQL statement as the
// idempotency record (httpmw.Commit, idem.Commit with the Backend's
// effect). A replica killed between the take and the record leaves the
// take's answer and the record in flight: the client's retry finds the
// take done and records the order once. With Redlock the records are
// spread over several servers and cannot share a script with the order,
// so the order is written under its ID, refusing a second one; the stock
// lives on Redlock's first server (a quorum of independent servers cannot
// keep one count: redlockstore.ErrNoStock). Sales need no SKU lock
// (Config.LockFree, the demo's default); with it, the lock is released
// only after the record is committed.
//
// On a Redis Cluster the script and its keys must share a hash slot. Every
// key of a SKU carries the hash tag {sku}, and the order's idempotency
// record is placed there too (httpmw.WithPlacement, grpcmw.WithPlacement,
// kafkamw.WithPlacement for the shipment: idem.Placed), so the sale still
// commits with its record in one script. Order IDs name their SKU
// ("o-<hash>-<sku>"), so an order is found by its ID alone. With
// ?replicas=1 in the store URL a shard's primary can be killed mid-sale
// without losing an answered order.
//
// The order.created event is written into an outbox by the sale itself and
// relayed to Kafka by one replica at a time (RelayOutbox, under
// lead.Run: a dead relay's successor takes over within the lock's TTL);
// its message-id is the order's ID, so an entry relayed again after a
// crash is consumed once. The order keeps
// the trace context of the request that sold it (Order.Trace), and the
// relay sends it in the message's headers: with OpenTelemetry set up
// (a TracerProvider, a propagator, otelobs on the store), the sale, the
// message and the shipment are one trace.
//
// # Running it
//
//	go run ./examples/inventory/cmd/inventory --demo      # make run
//	go run ./examples/inventory/cmd/inventory --store redis://127.0.0.1:6379 --kafka 127.0.0.1:9092
//	go run ./examples/inventory/cmd/inventory --store 'redis-cluster://127.0.0.1:7000,127.0.0.1:7001?replicas=1' --kafka 127.0.0.1:9092
//	go run ./examples/inventory/cmd/flashsale --targets http://127.0.0.1:8080
//
// The HTTP API:
//
//	PUT  /v1/items/{sku}   {"stock": N}                       → 200 {"sku","stock","sold"} (a new sale: none sold)
//	GET  /v1/items/{sku}                                      → 200 {"sku","stock","sold","held"}
//	POST /v1/orders        {"sku","qty","user"} + Idempotency-Key
//	                       → 201 {"order_id","sku","qty","user","fence"}; 409 sold_out; 404 unknown_sku
//	POST /v1/holds         {"sku","qty","user","ttl_ms"} + Idempotency-Key
//	                       → 201 {"hold_id","sku","qty","user","expires"}; 409 sold_out
//	POST /v1/holds/{id}/pay {"user"} + Idempotency-Key → 201 the order; 409 hold_expired
//	DELETE /v1/holds/{id}                                     → 204; 409 hold_paid
//	GET  /v1/orders/{id}   GET /v1/stats   GET /healthz   GET /metrics
//
// Errors are RFC 9457 problem+json with a stable code. The gRPC API
// (inventorypb) has the same operations, and serves grpc.health.v1 Check
// (SERVING while the store answers, as GET /healthz: Service.Healthy) and
// reflection, neither of which needs an idempotency key.
package inventory
