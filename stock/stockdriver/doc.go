// Package stockdriver is what a store implements to keep stock for package
// stock, and the rules every implementation applies. Users call package
// stock; this package is for drivers.
//
// A driver keeps, per item, four counters (Level) and one record per key
// (Record), and implements one method, Apply: a batch of operations on one
// item, applied atomically and in order by the store's own clock. The rules
// — what a take, a hold, a confirm or a release does to the counters and
// the key's record, and when a hold ends — are Apply's (the function of this
// package); a driver that can run Go where the data is consistent (a
// transaction, a compare-and-swap, a critical section) reads what Apply
// needs, calls it and writes back what it changed (memory, etcd,
// ZooKeeper). A driver that runs the call inside the server (a Redis
// script, an SQL function or procedure) implements the same rules there,
// and the conformance suite (package stocktest) holds them all to the
// same answers.
package stockdriver
