// Package flashsale is the inventory example's load generator: many buyers
// racing for little stock across replicas, some of them sending their order
// twice, and a report of what happened — with the invariants that must hold
// (nothing oversold, no order run twice, every replay identical, a shipment
// for every order).
package flashsale
