// Command inventory runs a flash sale: many buyers, little stock, and every
// order submitted several times at once, as impatient clients and retrying
// proxies do. An idem.Guard runs each order once and replays its outcome to
// the duplicates; a lock.Mutex on the SKU with fenced writes keeps stock
// from being oversold. It prints what was sold and checks that nothing was
// oversold and no order ran twice; it exits with status 1 when an invariant
// fails.
//
//	go run ./examples/inventory                       # embedded driver
//	go run ./examples/inventory -redis 127.0.0.1:6379 # across a real Redis
package main
