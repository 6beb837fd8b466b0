// Package stock sells a limited number of units — a flash sale's phones,
// an event's seats — to many buyers at once across many processes: never
// below zero, once per key, without a lock around the sale.
//
//	sales, err := stock.New(st) // a store of storage.Open: every driver but Redlock
//	_, err = sales.Put(ctx, "phone-x", 100)
//	sale, err := sales.Take(ctx, "phone-x", orderID, 1)
//	if errors.Is(err, stock.ErrSoldOut) { ... } // a business answer, not a store failure
//
// # Once per key
//
// Every Take and Hold names a key (the order, the request's idempotency
// key). The store records the key's answer in the same atomic step that
// moves the units — one Redis script, one SQL statement, one critical
// section in memory, one compare-and-set transaction on etcd and
// ZooKeeper — so a retry with the key, from any process, gets the
// first answer (the units, or sold out) with Replayed set and takes
// nothing more, for as long as the answer is remembered (WithMemory, a day
// by default). Inside an idem.Guard run an empty key is the run's own
// (idem.KeyFrom): a request retried after its process died between the
// take and its record finds the take done.
//
// # Holds that expire
//
// A checkout reserves before it sells: Hold takes units out of the free
// ones for a while, Confirm sells them, Release gives them back, and a hold
// nobody confirms ends by itself when its TTL has passed, by the store's
// clock, also when its holder's process died — its units are free again
// exactly once, and a Confirm after that fails with ErrHoldExpired. At any
// time, Level reads what was put and how much of it is free, held and sold,
// and Free + Held + Sold == Put.
//
// # Merged takes
//
// The operations on one item that arrive while a store call for it is in
// flight travel together in the next call (up to WithMaxMerge): a flash
// sale's thousand concurrent takes of one item are a few store calls, each
// answered on its own. Across processes the store orders the calls (the
// script, the item's row lock, a compare-and-set on the item). A process has at most one call in flight
// per item, so a hot item costs the store a call per round trip, not per
// buyer. The merge sizes are reported (observe.StockApply's Count).
//
// # Stores
//
// storage/memstore, storage/redisstore (one server, Sentinel, Cluster: an
// item's keys share its hash tag), storage/sqlstore (PostgreSQL, MySQL,
// MariaDB), storage/etcdstore (a hold's units are bound to an etcd lease:
// its TTL rounds up to whole seconds, at least etcd's minimum) and
// storage/zkstore keep stock, and all pass the conformance suite in
// stock/stocktest, with worker processes killed mid-take and mid-hold.
// storage/redlockstore refuses (redlockstore.ErrNoStock): a count kept on
// a majority of independent servers is not one count. What a store
// implements is package stockdriver.
package stock
