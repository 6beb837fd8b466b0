// Package integration holds oncekit's end-to-end tests: the inventory
// service (examples/inventory) run as separate replica processes against
// real Redis, Redlock and etcd servers and a Kafka-protocol broker, with
// faults injected into real processes — a replica killed with SIGKILL in
// the middle of a burst of duplicated orders, the store killed and
// restarted — and the invariants checked from outside: nothing oversold, no
// order run twice, every replay identical to its original, a shipment per
// order.
//
// Its tests run one at a time (no t.Parallel): each drives three replica
// processes, a flash sale or a fault against a store, and several at once
// on two cores stretched sales past their buyers' retry budgets and
// hand-overs past the bounds the tests check.
//
// It has no API; run it with `make test` (or `go test ./integration` with
// the services up: `make services-up` and the variables it prints).
package integration
