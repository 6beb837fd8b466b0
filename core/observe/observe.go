package observe

import (
	"context"
	"time"
)

// Op names what happened. The set is closed and small, so an adapter can use
// it as a metric label.
type Op string

// Operations. The lock operations are reported by lock.Mutex, the idem ones
// by idem.Guard, the hand-off by the drivers. A middleware names its own
// Op for one request or message ("http.request", "grpc.call",
// "kafka.message": httpmw.OpRequest, grpcmw.OpCall, kafkamw.OpMessage) and
// marks its events with Event.Request: core knows no transport.
const (
	// LockAcquire is one Mutex.Lock or TryLock: Outcome Acquired, Busy,
	// Canceled, Invalid or Error; Fence; Duration is the time spent waiting.
	LockAcquire Op = "lock.acquire"
	// LockRelease is the release of a Mutex lease: Outcome Released, Lost or
	// Error; Held is how long it was held.
	LockRelease Op = "lock.release"
	// LockRefresh is one watchdog refresh: Outcome OK, Lost or Error.
	LockRefresh Op = "lock.refresh"
	// LockLost (a point event) is a held lease lost before its release.
	LockLost Op = "lock.lost"
	// LockHandOff (a point event, from a driver) is a waiter taking a key
	// right after it was freed: Duration runs from the release (Outcome
	// Local: a lease of the same process) or from the release notice
	// (Outcome Notified: another process's release) to the moment the
	// waiter holds the key.
	LockHandOff Op = "lock.handoff"

	// IdemBegin is one claim of an idempotency key: Outcome Acquired,
	// Replayed, InFlight, Mismatch, Invalid or Error; Fence of a new claim.
	IdemBegin Op = "idem.begin"
	// IdemComplete stores a run's result: Outcome Stored, Refused (the
	// run's effect refused), Lost or Error.
	IdemComplete Op = "idem.complete"
	// IdemAbandon drops a claim whose run failed: Outcome Abandoned, Lost or
	// Error.
	IdemAbandon Op = "idem.abandon"
	// IdemLost (a point event) is a claim lost while its run was busy.
	IdemLost Op = "idem.lost"

	// StockTake is one stock.Stock.Take (Key: the item): Outcome Sold, SoldOut,
	// Replayed (a key's earlier answer, whatever it was), Mismatch,
	// Invalid or Error.
	StockTake Op = "stock.take"
	// StockHold is one stock.Stock.Hold: Outcome Held, SoldOut, Replayed,
	// Mismatch, Invalid or Error.
	StockHold Op = "stock.hold"
	// StockConfirm is one stock.Stock.Confirm: Outcome Sold, Replayed, Expired
	// (the hold ran out first), Released, Mismatch, Invalid or Error.
	StockConfirm Op = "stock.confirm"
	// StockRelease is one stock.Stock.Release: Outcome Released, Replayed,
	// Expired, Mismatch, Invalid or Error.
	StockRelease Op = "stock.release"
	// StockApply is one call to the store for an item, carrying Count
	// merged operations: Outcome OK or Error.
	StockApply Op = "stock.apply"
	// StockExpired (a point event) is Count holds of an item that ran out
	// unconfirmed, their units free again.
	StockExpired Op = "stock.expired"
)

// Outcome is how an operation ended; like Op it is a small closed set.
type Outcome string

// Outcomes.
const (
	OK       Outcome = "ok"
	Acquired Outcome = "acquired"
	Busy     Outcome = "busy"     // the key is held by someone else
	Canceled Outcome = "canceled" // the caller's context ended first
	Invalid  Outcome = "invalid"  // bad input: a key, a TTL, a header
	Error    Outcome = "error"    // the store failed or could not be reached
	Released Outcome = "released"
	Lost     Outcome = "lost"

	Replayed Outcome = "replayed"  // a stored result was returned
	InFlight Outcome = "in_flight" // another run holds the key
	Mismatch Outcome = "mismatch"  // same key, other request
	Stored   Outcome = "stored"
	// Refused is an effect whose own condition refused it
	// (idem.ErrEffectRefused: a sell-out, a balance too low): the
	// application's answer, not a store failure — nothing was written and
	// the claim was given back.
	Refused   Outcome = "refused"
	Abandoned Outcome = "abandoned"

	Sold     Outcome = "sold"     // stock taken and sold
	SoldOut  Outcome = "sold_out" // too few free units: nothing taken
	Held     Outcome = "held"     // stock held, to be confirmed or released
	Expired  Outcome = "expired"  // a hold that ran out unconfirmed
	Executed Outcome = "executed" // the middleware ran the handler

	Duplicate    Outcome = "duplicate"     // a message already processed, skipped
	DeadLettered Outcome = "dead_lettered" // a message sent to the dead-letter topic
	Deferred     Outcome = "deferred"      // a message moved to a retry topic

	Local    Outcome = "local"    // hand-off inside one process
	Notified Outcome = "notified" // hand-off after a release notice
)

// Event describes one operation or point event.
type Event struct {
	Op      Op
	Driver  string // "memory", "redis", "redlock", "etcd"; "" when unknown
	Key     string // the raw key: never a metric label; log it hashed (HashKey)
	Outcome Outcome
	Fence   uint64
	// Duration is how long the operation took (for LockAcquire: the wait).
	Duration time.Duration
	// Held is how long a released lease was held (LockRelease).
	Held time.Duration
	// Route is the middleware's route pattern, gRPC method or topic.
	Route string
	// Count is how many operations one StockApply carried (the merge
	// size), or how many holds a StockExpired ended.
	Count int
	// Request marks a middleware's event: one request answered or one
	// message consumed (nil for the lock and idem operations).
	Request *Request
	Err     error
}

// Request describes a middleware's unit of work, so that an observer
// reports any transport without knowing it: a request answered (a server
// span) or a message consumed (a consumer span), with the transport's own
// attributes.
type Request struct {
	// Consumer says a message was taken from a queue or log, rather than
	// a request answered.
	Consumer bool
	// Name is what a trace calls the unit when not its Op ("process
	// orders", as OpenTelemetry's messaging conventions name a consumer's
	// processing); "" for the Op.
	Name string
	// Attrs are the transport's attributes, keyed as OpenTelemetry's
	// semantic conventions key them ("messaging.system": "kafka").
	// Values are strings or int64s.
	Attrs []Attr
}

// Attr is one attribute of a Request.
type Attr struct {
	Key   string
	Value any // string or int64
}

// Observer receives oncekit's events. Implementations must be safe for
// concurrent use and must not block: they run on the caller's goroutine.
//
// Start and End bracket an operation; the context Start returns (a tracer
// puts its span there) is the one the operation runs with and the one End
// gets. Record reports a point event that has no duration of its own.
type Observer interface {
	Start(ctx context.Context, ev Event) context.Context
	End(ctx context.Context, ev Event)
	Record(ctx context.Context, ev Event)
}

// Source is implemented by drivers: the name they report as Event.Driver
// and the Observer they were configured with (nil for none). lock.Mutex and
// idem.Guard report through their driver's Observer unless given their own.
type Source interface {
	DriverName() string
	Observer() Observer
}

// DriverOf returns v's driver name, or "" if v is not a Source.
func DriverOf(v any) string {
	if s, ok := v.(Source); ok {
		return s.DriverName()
	}
	return ""
}

// ObserverOf returns v's Observer, or nil if v is not a Source.
func ObserverOf(v any) Observer {
	if s, ok := v.(Source); ok {
		return s.Observer()
	}
	return nil
}

// Multi returns an Observer that reports to each of obs in order; nil
// entries are skipped. It returns nil when none is left.
func Multi(obs ...Observer) Observer {
	var m multi
	for _, o := range obs {
		switch o := o.(type) {
		case nil:
		case multi:
			m = append(m, o...)
		default:
			m = append(m, o)
		}
	}
	switch len(m) {
	case 0:
		return nil
	case 1:
		return m[0]
	}
	return m
}

type multi []Observer

func (m multi) Start(ctx context.Context, ev Event) context.Context {
	for _, o := range m {
		ctx = o.Start(ctx, ev)
	}
	return ctx
}

func (m multi) End(ctx context.Context, ev Event) {
	for i := len(m) - 1; i >= 0; i-- {
		m[i].End(ctx, ev)
	}
}

func (m multi) Record(ctx context.Context, ev Event) {
	for _, o := range m {
		o.Record(ctx, ev)
	}
}

// Func adapts a function to an Observer: it gets every ended operation and
// every point event (Start is ignored). Handy for tests and quick logging.
type Func func(ctx context.Context, ev Event)

func (f Func) Start(ctx context.Context, _ Event) context.Context { return ctx }
func (f Func) End(ctx context.Context, ev Event)                  { f(ctx, ev) }
func (f Func) Record(ctx context.Context, ev Event)               { f(ctx, ev) }

// Call is an operation in progress, from Begin. The zero Call (from a nil
// Observer) does nothing.
type Call struct {
	o     Observer
	ctx   context.Context
	ev    Event
	start time.Time
}

// Begin starts op on o and returns the context to run it with. With a nil
// Observer it costs nothing and returns ctx unchanged.
func Begin(ctx context.Context, o Observer, op Op, driver, key string) (context.Context, Call) {
	if o == nil {
		return ctx, Call{}
	}
	ev := Event{Op: op, Driver: driver, Key: key}
	ctx = o.Start(ctx, ev)
	return ctx, Call{o: o, ctx: ctx, ev: ev, start: time.Now()}
}

// BeginEvent is Begin with more of the event known at the start (a
// middleware's Request, a route): ev's Op, Driver, Key, Route and
// Request.
func BeginEvent(ctx context.Context, o Observer, ev Event) (context.Context, Call) {
	if o == nil {
		return ctx, Call{}
	}
	ctx = o.Start(ctx, ev)
	return ctx, Call{o: o, ctx: ctx, ev: ev, start: time.Now()}
}

// Route sets the event's route (middleware).
func (c *Call) Route(r string) { c.ev.Route = r }

// Count sets the event's Count (StockApply).
func (c *Call) Count(n int) { c.ev.Count = n }

// End reports the operation's outcome; Duration is measured from Begin.
func (c *Call) End(outcome Outcome, fence uint64, err error) {
	c.EndHeld(outcome, fence, 0, err)
}

// EndHeld is End for a release, with how long the lease was held.
func (c *Call) EndHeld(outcome Outcome, fence uint64, held time.Duration, err error) {
	if c.o == nil {
		return
	}
	ev := c.ev
	ev.Outcome, ev.Fence, ev.Held, ev.Err = outcome, fence, held, err
	ev.Duration = time.Since(c.start)
	c.o.End(c.ctx, ev)
}

// Record reports a point event on o, if o is not nil.
func Record(ctx context.Context, o Observer, ev Event) {
	if o != nil {
		o.Record(ctx, ev)
	}
}
