// Package inventory is oncekit's example service, the one to copy: a flash
// sale where many buyers race for little stock across replicas, over HTTP
// and gRPC, with each sale announced on Kafka and shipped once.
//
// It shows the three cases oncekit exists for:
//
//   - Stock overselling: a sale decrements a SKU's stock under a per-SKU
//     lock (lock.Mutex) and is fenced with that lock's fence: a replica
//     that stalled past its lock's TTL cannot write over a later holder's
//     sale (ErrStaleFence).
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
// The sale's writes — stock, the order, its outbox entry — commit in the
// same Redis script or etcd transaction as the idempotency record
// (httpmw.Commit, idem.Commit with the Backend's effect): a replica killed
// between the sale and the response leaves neither, and the client's retry
// sells once. With Redlock the records are spread over several servers and
// cannot share a script with the stock, so the sale script itself records
// the order under its ID — derived from the record's stored key — and
// refuses a second one. The SKU lock is released only after the record is
// committed, so the next sale sees this one.
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
//	PUT  /v1/items/{sku}   {"stock": N}                       → 200 {"sku","stock","sold"}
//	GET  /v1/items/{sku}                                      → 200 {"sku","stock","sold"}
//	POST /v1/orders        {"sku","qty","user"} + Idempotency-Key
//	                       → 201 {"order_id","sku","qty","user","fence"}; 409 sold_out; 404 unknown_sku
//	GET  /v1/orders/{id}   GET /v1/stats   GET /healthz   GET /metrics
//
// Errors are RFC 9457 problem+json with a stable code. The gRPC API
// (inventorypb) has the same operations, and serves grpc.health.v1 Check
// (SERVING while the store answers, as GET /healthz: Service.Healthy) and
// reflection, neither of which needs an idempotency key.
package inventory
