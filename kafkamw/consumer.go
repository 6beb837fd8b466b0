package kafkamw

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"

	"github.com/oncekit/oncekit/core/idem"
	"github.com/oncekit/oncekit/core/idem/idemdriver"
	"github.com/oncekit/oncekit/core/observe"
)

// Reader is what a Consumer reads from, in a consumer group, so that
// CommitMessages commits the group's offsets: KafkaGoReader over kafka-go,
// or kafkamw/franz's Reader over franz-go.
type Reader interface {
	FetchMessage(ctx context.Context) (Message, error)
	CommitMessages(ctx context.Context, msgs ...Message) error
}

// Handler handles one message. Its context carries the message's stable
// idempotency key (idem.KeyFrom) and its claim's fence (idem.FenceFrom), so
// that its effect can commit with the record (idem.Commit) or be made
// conditional on the key at its resource. It is cancelled when the Consumer
// stops abruptly or the claim is lost. An error is retried (WithRetry),
// unless it is Permanent; then the message is dead-lettered.
type Handler func(ctx context.Context, msg Message) error

// Stats counts what a Consumer did since it was made.
type Stats struct {
	Fetched      int64 // messages read from the Reader
	Handled      int64 // messages whose handler succeeded here
	Duplicates   int64 // messages already handled (or dead-lettered) before: committed without the handler
	Retries      int64 // handler calls that failed and were tried again
	DeadLettered int64 // messages published to the dead-letter destination
	Deferred     int64 // messages moved to the retry topic (WithRetryTopic)
	StoreErrors  int64 // claims or completions the store did not answer (retried)
	Commits      int64 // successful offset commits (each may cover many messages and partitions)
	CommitErrors int64 // failed offset commits (retried)
}

// OpMessage is the observe.Op of one message through a Consumer: its
// Route is the topic, its Outcome Executed, Duplicate, DeadLettered,
// Deferred, Canceled or Error.
const OpMessage observe.Op = "kafka.message"

// OpenTelemetry's messaging attributes (semantic conventions 1.26+) of a
// message's event (observe.Request.Attrs).
const (
	AttrMessagingSystem    = "messaging.system"
	AttrMessagingOperation = "messaging.operation.type"
	AttrMessagingDest      = "messaging.destination.name"
	AttrMessagingPartition = "messaging.destination.partition.id"
	AttrMessagingOffset    = "messaging.kafka.offset"
	AttrMessagingGroup     = "messaging.consumer.group.name"
)

// messageRequest describes msg's processing for observers: a consumer's
// "process {topic}", with its coordinates.
func messageRequest(msg Message, group string) *observe.Request {
	attrs := []observe.Attr{
		{Key: AttrMessagingSystem, Value: "kafka"},
		{Key: AttrMessagingOperation, Value: "process"},
		{Key: AttrMessagingDest, Value: msg.Topic},
		{Key: AttrMessagingPartition, Value: strconv.Itoa(msg.Partition)},
		{Key: AttrMessagingOffset, Value: msg.Offset},
	}
	if group != "" {
		attrs = append(attrs, observe.Attr{Key: AttrMessagingGroup, Value: group})
	}
	return &observe.Request{Consumer: true, Name: "process " + msg.Topic, Attrs: attrs}
}

// Consumer runs a Handler once per message key over a consumer group: see the
// package documentation.
type Consumer struct {
	r       Reader
	guard   *idem.Guard
	handler Handler
	cfg     config

	slots   chan struct{} // one per message in flight (WithPipeline)
	workers chan struct{} // one per handler running (WithConcurrency)
	kick    chan struct{} // a message is done: commit

	mu        sync.Mutex
	lanes     map[partition]*lane
	keys      map[idemdriver.Key]chan struct{} // key -> closed when the latest message in flight with it is done
	toCommit  map[partition]*candidate
	committed map[partition]int64
	stats     Stats
	running   bool
	stopFetch context.CancelCauseFunc
	stopWork  context.CancelCauseFunc
	done      chan struct{}
	fatal     error
	shutdown  bool
}

type partition struct {
	topic string
	id    int
}

// lane is one partition's messages in flight, in fetch (offset) order.
type lane struct {
	pending []*entry
	base    int64         // offset before the lane's first message
	last    int64         // offset of the latest message fetched
	turn    chan struct{} // closed when the latest message's turn is over
}

type entry struct {
	msg  Message
	done bool
}

type candidate struct {
	msg   Message
	fails int
}

var (
	resultHandled      = []byte{'h'}
	resultDeadLettered = []byte{'d'}
	resultDeferred     = []byte{'r'} // moved to the retry topic (under the message's coordinates)
	errShutdown        = errors.New("kafkamw: consumer shut down")
)

// commitTimeout bounds one offset commit.
const commitTimeout = 10 * time.Second

// NewConsumer returns a Consumer that reads r, claims each message's key in
// guard's store, runs handler once per key and commits offsets as messages
// are done. r must be in a consumer group (its adapter says which, or
// WithGroup).
func NewConsumer(r Reader, guard *idem.Guard, handler Handler, opts ...Option) (*Consumer, error) {
	cfg := defaults()
	for _, o := range opts {
		o(&cfg)
	}
	if r == nil || guard == nil || handler == nil {
		cfg.errs = append(cfg.errs, errors.New("NewConsumer needs a Reader, a Guard and a Handler"))
	}
	if g, ok := r.(interface{ GroupID() string }); ok && cfg.group == "" {
		cfg.group = g.GroupID() // the adapter's (KafkaGoReader, kafkamw/franz)
		if cfg.group == "" {
			cfg.errs = append(cfg.errs, errors.New("the Reader has no consumer group: offsets can only be committed in a consumer group"))
		}
	}
	if cfg.scope == nil {
		if cfg.group == "" {
			cfg.errs = append(cfg.errs, errors.New("no consumer group to scope keys by: use WithGroup or WithScope"))
		}
		group, prefix := cfg.group, cfg.dlqPrefix
		cfg.scope = func(m Message) string {
			topic, g := origin(m, prefix) // a moved message keeps its original key space
			if g == "" {
				g = group
			}
			return idemdriver.KafkaScope(g, topic)
		}
	}
	if err := cfg.check(); err != nil {
		return nil, err
	}
	return &Consumer{
		r: r, guard: guard, handler: handler, cfg: cfg,
		slots:     make(chan struct{}, cfg.pipeline),
		workers:   make(chan struct{}, cfg.concurrency),
		kick:      make(chan struct{}, 1),
		lanes:     make(map[partition]*lane),
		keys:      make(map[idemdriver.Key]chan struct{}),
		toCommit:  make(map[partition]*candidate),
		committed: make(map[partition]int64),
	}, nil
}

// Stats returns what the Consumer did so far.
func (c *Consumer) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats
}

// Uncommitted returns, per topic and partition this Consumer reads, how
// many messages it fetched whose offsets are not committed yet: in flight,
// waiting for an earlier message of their partition, or done and waiting
// for the commit. A partition stuck behind a slow or failing message grows
// here (promobs.Observer.WatchConsumer exports it as a gauge).
func (c *Consumer) Uncommitted() map[string]map[int]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]map[int]int64{}
	for p, l := range c.lanes {
		from := l.base
		if done, ok := c.committed[p]; ok && done > from {
			from = done
		}
		if out[p.topic] == nil {
			out[p.topic] = map[int]int64{}
		}
		out[p.topic][p.id] = max(l.last-from, 0)
	}
	return out
}

// Run reads and handles messages until ctx ends, Shutdown is called, the
// Reader fails, or a message can be neither handled nor dead-lettered.
// Before it returns, the handlers in flight finish (when ctx ended, their
// contexts are cancelled first) and the offsets of every message done are
// committed. It returns nil after Shutdown, ctx's error when ctx ended, a
// *PoisonError for a message that failed every attempt with no dead-letter
// destination, or the Reader's error. Run may be called once; the caller
// closes the Reader after it returns.
func (c *Consumer) Run(ctx context.Context) error {
	work, stopWork := context.WithCancelCause(ctx)
	fetch, stopFetch := context.WithCancelCause(work)
	defer stopWork(nil)
	defer stopFetch(nil)
	c.mu.Lock()
	if c.running {
		c.mu.Unlock()
		return errors.New("kafkamw: Run called twice")
	}
	if c.shutdown {
		c.mu.Unlock()
		return nil
	}
	c.running, c.stopFetch, c.stopWork, c.done = true, stopFetch, stopWork, make(chan struct{})
	c.mu.Unlock()
	defer close(c.done)

	committerDone := make(chan struct{})
	stopCommitter := make(chan struct{})
	go func() {
		defer close(committerDone)
		c.commitLoop(stopCommitter)
	}()

	var wg sync.WaitGroup
	fetchErr := c.fetchLoop(fetch, work, &wg)
	wg.Wait()
	close(stopCommitter)
	<-committerDone

	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.fatal != nil:
		return c.fatal
	case fetchErr != nil:
		return fetchErr
	case c.shutdown:
		return nil
	}
	return ctx.Err()
}

// Shutdown stops fetching and waits for Run to return: the handlers in
// flight finish with their contexts intact and their offsets are committed.
// When ctx ends first, the handlers' contexts are cancelled, Shutdown still
// waits for Run, and returns ctx's error. After Shutdown, Run returns nil at
// once.
func (c *Consumer) Shutdown(ctx context.Context) error {
	c.mu.Lock()
	c.shutdown = true
	stopFetch, stopWork, done := c.stopFetch, c.stopWork, c.done
	c.mu.Unlock()
	if done == nil {
		return nil
	}
	stopFetch(errShutdown)
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		stopWork(context.Cause(ctx))
		<-done
		return ctx.Err()
	}
}

// fail stops the Consumer with err (the first one wins).
func (c *Consumer) fail(err error) {
	c.mu.Lock()
	if c.fatal == nil {
		c.fatal = err
	}
	stop := c.stopFetch
	c.mu.Unlock()
	stop(err)
}

func (c *Consumer) fetchLoop(fetch, work context.Context, wg *sync.WaitGroup) error {
	for {
		select {
		case c.slots <- struct{}{}:
		case <-fetch.Done():
			return nil
		}
		msg, err := c.r.FetchMessage(fetch)
		if err != nil {
			<-c.slots
			if fetch.Err() != nil {
				return nil
			}
			if errors.Is(err, io.EOF) {
				return fmt.Errorf("kafkamw: the Reader was closed while the Consumer ran: %w", err)
			}
			return fmt.Errorf("kafkamw: fetch: %w", err)
		}
		c.dispatch(work, msg, wg)
	}
}

// dispatch queues msg in its partition's lane and starts its processing:
// it waits for the message before it with the same key (if one is in
// flight here), is claimed at once, and runs its handler when every earlier
// message of its partition has had its turn.
func (c *Consumer) dispatch(ctx context.Context, msg Message, wg *sync.WaitGroup) {
	p := partition{msg.Topic, msg.Partition}
	key, keyErr := c.keyOf(msg)
	e := &entry{msg: msg}
	mine, keyMine := make(chan struct{}), make(chan struct{})

	c.mu.Lock()
	c.stats.Fetched++
	l := c.lanes[p]
	if l != nil && msg.Offset > l.last+1 {
		// Read on past a gap: the partition was assigned anew and resumed
		// where the group's offset had moved on (another member committed
		// it meanwhile), or compaction removed records. Either way every
		// offset below is done: never commit one below it, which would move
		// the group's offset backwards. (The lane is kept: its messages
		// still go first, in order.)
		if done, ok := c.committed[p]; !ok || done < msg.Offset-1 {
			c.committed[p] = msg.Offset - 1
		}
		if cand := c.toCommit[p]; cand != nil && cand.msg.Offset < msg.Offset {
			delete(c.toCommit, p)
		}
	}
	if l == nil || msg.Offset <= l.last {
		// New, or read again from an earlier offset (the partition was
		// assigned anew at a rebalance): messages of the old lane still
		// finish, but only this lane's are committed from now on.
		closed := make(chan struct{})
		close(closed)
		l = &lane{turn: closed, base: msg.Offset - 1}
		c.lanes[p] = l
	}
	l.last = msg.Offset
	l.pending = append(l.pending, e)
	prev := l.turn
	l.turn = mine
	var keyPrev chan struct{}
	if keyErr == nil {
		keyPrev = c.keys[key]
		c.keys[key] = keyMine
	}
	c.mu.Unlock()

	// The turn passes on once this message's handler is done with it
	// (it succeeded, or the message was dead-lettered), not once its
	// completion is stored: the next handler of the partition runs while
	// this record is written. A message that needs no handler (a
	// duplicate) passes it on once every earlier message has had its own.
	var passOnce sync.Once
	pass := func() { passOnce.Do(func() { close(mine) }) }
	wg.Add(1)
	go func() {
		defer wg.Done()
		// The producer's trace context, when the message carries one: the
		// message's span and the handler continue its trace.
		mctx := extract(ctx, c.cfg.propagator, &msg)
		var octx context.Context
		var call observe.Call
		if o := c.guard.Observer(); o != nil {
			octx, call = observe.BeginEvent(mctx, o, observe.Event{
				Op: OpMessage, Driver: c.guard.DriverName(), Route: msg.Topic, Request: messageRequest(msg, c.cfg.group),
			})
		} else {
			octx = mctx
		}
		outcome := c.process(octx, msg, key, keyErr, prev, keyPrev, pass)
		call.End(outcome, 0, nil)
		ok := outcome != observe.Canceled && outcome != observe.Error
		c.mu.Lock()
		if keyErr == nil && c.keys[key] == keyMine {
			delete(c.keys, key)
		}
		e.done = ok
		c.mu.Unlock()
		close(keyMine)
		select {
		case <-prev:
		case <-ctx.Done():
		}
		pass()
		<-c.slots
		if ok {
			select {
			case c.kick <- struct{}{}:
			default:
			}
		}
	}()
}
