// Package promobs reports oncekit's events (package core/observe) as
// Prometheus metrics: counters of acquisitions, releases, refreshes, lost
// leases and idempotency claims by outcome, store errors, and histograms of
// wait, hold and hand-off times, with low-cardinality labels only (driver,
// operation, outcome, route) — never a key.
//
//	metrics := promobs.New()
//	prometheus.MustRegister(metrics)
//	store, _ := redisstore.New(client, redisstore.WithObserver(metrics))
//
// Every Mutex, Guard and middleware built on that store then reports
// through it. Combine it with tracing or logging with observe.Multi.
package promobs
