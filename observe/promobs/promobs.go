package promobs

import (
	"context"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/oncekit/oncekit/core/observe"
)

// Option configures an Observer.
type Option func(*config)

type config struct {
	namespace string
	buckets   []float64
	labels    prometheus.Labels
}

// WithNamespace sets the metric name prefix. Default "oncekit".
func WithNamespace(ns string) Option { return func(c *config) { c.namespace = ns } }

// WithBuckets sets the histogram buckets, in seconds. Default: 100 µs to
// about 26 s, doubling.
func WithBuckets(b []float64) Option { return func(c *config) { c.buckets = b } }

// WithConstLabels adds labels with fixed values to every metric (a
// service name, a region).
func WithConstLabels(l prometheus.Labels) Option { return func(c *config) { c.labels = l } }

// Observer is an observe.Observer that keeps Prometheus metrics. It is a
// prometheus.Collector: register it once, e.g. prometheus.MustRegister(o).
//
// Metrics (with the default namespace):
//
//	oncekit_lock_acquire_total{driver,outcome}           acquisitions by outcome
//	oncekit_lock_wait_seconds{driver}                    wait of successful acquisitions
//	oncekit_lock_hold_seconds{driver}                    how long released leases were held
//	oncekit_lock_release_total{driver,outcome}           releases: released, lost, error
//	oncekit_lock_refresh_total{driver,outcome}           watchdog refreshes: ok, lost, error
//	oncekit_lock_lost_total{driver}                      leases lost while held
//	oncekit_lock_handoff_seconds{driver,path}            release (local) or notice (notified) to next holder
//	oncekit_idem_claims_total{driver,outcome}            acquired, replayed, in_flight, mismatch, invalid,
//	                                                     canceled, stored, refused (an effect's own
//	                                                     refusal: a sell-out), abandoned, lost
//	oncekit_store_errors_total{driver,op}                operations the store failed (never an
//	                                                     effect's refusal)
//	oncekit_store_duration_seconds{driver,op}            store operations' latency: idem.begin, idem.complete,
//	                                                     idem.abandon, lock.refresh, lock.release, stock.apply
//	oncekit_middleware_requests_total{op,route,outcome}  HTTP requests, gRPC calls, Kafka messages
//	oncekit_middleware_duration_seconds{op,route}        their duration
//	oncekit_kafka_duplicates_skipped_total{route}        Kafka messages already processed (route: topic)
//	oncekit_kafka_dead_lettered_total{route}             Kafka messages sent to the dead-letter topic
//	oncekit_stock_operations_total{driver,op,outcome}    stock takes, holds, confirms, releases: sold,
//	                                                     sold_out, held, expired, released, replayed, …
//	oncekit_stock_holds_expired_total{driver}            holds that ran out unconfirmed (units freed)
//	oncekit_stock_merge_size{driver}                     operations one store call carried
//
// Gauges of what a process holds now come from its Guards, Mutexes and
// Consumers (WatchGuard, WatchMutex, WatchConsumer):
//
//	oncekit_idem_claims_in_flight{name}                  runs holding their claim
//	oncekit_lock_leases_held{name}                       leases taken and not released
//	oncekit_kafka_uncommitted_messages{name,topic,partition}  fetched, offset not committed yet
//
// No label ever holds a key. Route is the middleware's route pattern, gRPC
// method or topic: a bounded set as long as the middleware is given
// patterns, not raw paths.
type Observer struct {
	acquire, release, refresh, claims, storeErrors, requests *prometheus.CounterVec
	lost, duplicates, deadLettered, stock, expired           *prometheus.CounterVec
	wait, hold, handoff, duration, storeDuration, merge      *prometheus.HistogramVec
	all                                                      []prometheus.Collector
	cfg                                                      config
	inFlight, leases, uncommitted                            *prometheus.Desc

	mu        sync.Mutex
	guards    map[string]interface{ InFlight() int64 }
	mutexes   map[string]interface{ Held() int64 }
	consumers map[string]interface {
		Uncommitted() map[string]map[int]int64
	}
}

// DefaultBuckets are the histogram buckets in seconds: 100 µs doubling to
// about 26 s.
var DefaultBuckets = prometheus.ExponentialBuckets(0.0001, 2, 19)

// New returns an Observer; register it with a prometheus.Registerer.
func New(opts ...Option) *Observer {
	c := config{namespace: "oncekit", buckets: DefaultBuckets}
	for _, o := range opts {
		o(&c)
	}
	o := &Observer{cfg: c, guards: map[string]interface{ InFlight() int64 }{},
		mutexes: map[string]interface{ Held() int64 }{},
		consumers: map[string]interface {
			Uncommitted() map[string]map[int]int64
		}{}}
	desc := func(sub, name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(c.namespace, sub, name), help, labels, c.labels)
	}
	o.inFlight = desc("idem", "claims_in_flight", "Runs holding their idempotency claim now.", "name")
	o.leases = desc("lock", "leases_held", "Leases taken through a Mutex and not released yet.", "name")
	o.uncommitted = desc("kafka", "uncommitted_messages", "Messages fetched whose offsets are not committed yet.", "name", "topic", "partition")
	counter := func(sub, name, help string, labels ...string) *prometheus.CounterVec {
		v := prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: c.namespace, Subsystem: sub, Name: name, Help: help, ConstLabels: c.labels,
		}, labels)
		o.all = append(o.all, v)
		return v
	}
	histogram := func(sub, name, help string, labels ...string) *prometheus.HistogramVec {
		v := prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: c.namespace, Subsystem: sub, Name: name, Help: help, ConstLabels: c.labels, Buckets: c.buckets,
		}, labels)
		o.all = append(o.all, v)
		return v
	}
	o.acquire = counter("lock", "acquire_total", "Lock acquisitions by outcome.", "driver", "outcome")
	o.wait = histogram("lock", "wait_seconds", "Time successful acquisitions waited for their key.", "driver")
	o.hold = histogram("lock", "hold_seconds", "Time released leases were held.", "driver")
	o.release = counter("lock", "release_total", "Lease releases by outcome.", "driver", "outcome")
	o.refresh = counter("lock", "refresh_total", "Watchdog refreshes by outcome.", "driver", "outcome")
	o.lost = counter("lock", "lost_total", "Leases lost while held.", "driver")
	o.handoff = histogram("lock", "handoff_seconds",
		"Time from a release (path=local) or a release notice (path=notified) to the next holder.", "driver", "path")
	o.claims = counter("idem", "claims_total", "Idempotency claims by outcome.", "driver", "outcome")
	o.storeErrors = counter("store", "errors_total", "Operations the store failed or could not be reached for.", "driver", "op")
	o.storeDuration = histogram("store", "duration_seconds", "Latency of store operations (claims, completions, refreshes, releases).", "driver", "op")
	o.requests = counter("middleware", "requests_total", "Requests and messages through the middleware by outcome.", "op", "route", "outcome")
	o.duration = histogram("middleware", "duration_seconds", "Duration of requests and messages through the middleware.", "op", "route")
	o.duplicates = counter("kafka", "duplicates_skipped_total", "Kafka messages skipped as already processed.", "route")
	o.deadLettered = counter("kafka", "dead_lettered_total", "Kafka messages sent to the dead-letter topic.", "route")
	o.stock = counter("stock", "operations_total", "Stock takes, holds, confirms and releases by outcome.", "driver", "op", "outcome")
	o.expired = counter("stock", "holds_expired_total", "Stock holds that ran out unconfirmed, their units freed.", "driver")
	o.merge = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: c.namespace, Subsystem: "stock", Name: "merge_size", Help: "Stock operations one store call carried.",
		ConstLabels: c.labels, Buckets: prometheus.ExponentialBuckets(1, 2, 10),
	}, []string{"driver"})
	o.all = append(o.all, o.merge)
	return o
}

// WatchGuard exports g's runs in flight (idem.Guard.InFlight) as
// claims_in_flight{name}. Watching another Guard under the same name
// replaces it.
func (o *Observer) WatchGuard(name string, g interface{ InFlight() int64 }) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.guards[name] = g
}

// WatchMutex exports m's leases held (lock.Mutex.Held) as
// leases_held{name}.
func (o *Observer) WatchMutex(name string, m interface{ Held() int64 }) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.mutexes[name] = m
}

// WatchConsumer exports c's messages not yet committed per partition
// (kafkamw.Consumer.Uncommitted) as uncommitted_messages{name,topic,partition}.
func (o *Observer) WatchConsumer(name string, c interface {
	Uncommitted() map[string]map[int]int64
}) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.consumers[name] = c
}

// Describe implements prometheus.Collector.
func (o *Observer) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range o.all {
		c.Describe(ch)
	}
	ch <- o.inFlight
	ch <- o.leases
	ch <- o.uncommitted
}

// Collect implements prometheus.Collector.
func (o *Observer) Collect(ch chan<- prometheus.Metric) {
	for _, c := range o.all {
		c.Collect(ch)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	for name, g := range o.guards {
		ch <- prometheus.MustNewConstMetric(o.inFlight, prometheus.GaugeValue, float64(g.InFlight()), name)
	}
	for name, m := range o.mutexes {
		ch <- prometheus.MustNewConstMetric(o.leases, prometheus.GaugeValue, float64(m.Held()), name)
	}
	for name, c := range o.consumers {
		for topic, parts := range c.Uncommitted() {
			for p, n := range parts {
				ch <- prometheus.MustNewConstMetric(o.uncommitted, prometheus.GaugeValue, float64(n), name, topic, strconv.Itoa(p))
			}
		}
	}
}

// Start implements observe.Observer; metrics need nothing at the start.
func (o *Observer) Start(ctx context.Context, _ observe.Event) context.Context { return ctx }

// End implements observe.Observer.
func (o *Observer) End(_ context.Context, ev observe.Event) { o.count(ev) }

// Record implements observe.Observer.
func (o *Observer) Record(_ context.Context, ev observe.Event) { o.count(ev) }

func (o *Observer) count(ev observe.Event) {
	d, outcome := ev.Driver, string(ev.Outcome)
	if ev.Outcome == observe.Error {
		o.storeErrors.WithLabelValues(d, string(ev.Op)).Inc()
	}
	switch ev.Op {
	case observe.IdemBegin, observe.IdemComplete, observe.IdemAbandon, observe.LockRefresh, observe.LockRelease, observe.StockApply:
		if ev.Duration > 0 {
			o.storeDuration.WithLabelValues(d, string(ev.Op)).Observe(ev.Duration.Seconds())
		}
	}
	switch ev.Op {
	case observe.LockAcquire:
		o.acquire.WithLabelValues(d, outcome).Inc()
		if ev.Outcome == observe.Acquired {
			o.wait.WithLabelValues(d).Observe(ev.Duration.Seconds())
		}
	case observe.LockRelease:
		o.release.WithLabelValues(d, outcome).Inc()
		o.hold.WithLabelValues(d).Observe(ev.Held.Seconds())
	case observe.LockRefresh:
		o.refresh.WithLabelValues(d, outcome).Inc()
	case observe.LockLost:
		o.lost.WithLabelValues(d).Inc()
	case observe.LockHandOff:
		o.handoff.WithLabelValues(d, outcome).Observe(ev.Duration.Seconds())
	case observe.IdemBegin, observe.IdemComplete, observe.IdemAbandon, observe.IdemLost:
		if ev.Outcome != observe.Error {
			o.claims.WithLabelValues(d, outcome).Inc()
		}
	case observe.StockTake, observe.StockHold, observe.StockConfirm, observe.StockRelease:
		o.stock.WithLabelValues(d, string(ev.Op), outcome).Inc()
	case observe.StockApply:
		if ev.Outcome == observe.OK {
			o.merge.WithLabelValues(d).Observe(float64(ev.Count))
		}
	case observe.StockExpired:
		o.expired.WithLabelValues(d).Add(float64(ev.Count))
	default:
		if ev.Request == nil {
			return // an operation this version does not know
		}
		// A middleware's request or message, whatever its transport.
		o.requests.WithLabelValues(string(ev.Op), ev.Route, outcome).Inc()
		o.duration.WithLabelValues(string(ev.Op), ev.Route).Observe(ev.Duration.Seconds())
		switch ev.Outcome {
		case observe.Duplicate:
			o.duplicates.WithLabelValues(ev.Route).Inc()
		case observe.DeadLettered:
			o.deadLettered.WithLabelValues(ev.Route).Inc()
		}
	}
}

var (
	_ observe.Observer     = (*Observer)(nil)
	_ prometheus.Collector = (*Observer)(nil)
)
