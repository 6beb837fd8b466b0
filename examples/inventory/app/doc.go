// Package app is the inventory command's body (examples/inventory/cmd/inventory):
// flags, wiring, the replicas, the demo. It is a package so that a variant
// of the command — the benchmark's, which takes the SKU lock through a peer
// library — reuses all of it.
package app
