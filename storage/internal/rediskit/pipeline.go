package rediskit

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// Pipeliner is a Client that can send many commands in one round trip:
// every redis.UniversalClient.
type Pipeliner interface {
	Client
	Pipeline() redis.Pipeliner
}

// maxFlushers is how many pipelines may be in flight at once. While they
// are, new scripts queue, and the next flusher sends every queued one in a
// single write: under load, many callers' scripts share one round trip (and
// one pair of syscalls on each side); alone, a script goes out at once.
const maxFlushers = 4

// maxBatch bounds one pipeline.
const maxBatch = 512

// AutoPipeline returns a Client that sends the scripts of concurrent callers
// together (EVALSHA and EVAL; everything else goes straight to c). Each
// caller still gets its own reply, and a caller whose ctx ends stops
// waiting (a script already sent may still run, as with any Redis call
// whose reply is lost). Redis runs a pipeline's scripts one after another,
// each atomically, exactly as if sent one by one.
func AutoPipeline(c Pipeliner) Client { return &autoPipeline{Pipeliner: c} }

type autoPipeline struct {
	Pipeliner
	mu       sync.Mutex
	queue    []*pipedScript
	flushers int
}

// scriptCall is one script a caller sends.
type scriptCall struct {
	ctx    context.Context
	eval   bool // EVAL (script text) rather than EVALSHA
	ro     bool
	script string
	keys   []string
	args   []any
}

// pipedScript is a call queued for a pipeline, with its reply.
type pipedScript struct {
	scriptCall
	reply    *redis.Cmd
	done     chan struct{}
	canceled atomic.Bool
}

func (p *autoPipeline) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	return p.send(scriptCall{ctx: ctx, script: sha, keys: keys, args: args})
}

func (p *autoPipeline) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	return p.send(scriptCall{ctx: ctx, eval: true, script: script, keys: keys, args: args})
}

func (p *autoPipeline) EvalShaRO(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	return p.send(scriptCall{ctx: ctx, ro: true, script: sha, keys: keys, args: args})
}

func (p *autoPipeline) EvalRO(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	return p.send(scriptCall{ctx: ctx, eval: true, ro: true, script: script, keys: keys, args: args})
}

// send sends call: alone at once when nothing waits (no allocation), else
// queued for the next pipeline.
func (p *autoPipeline) send(call scriptCall) *redis.Cmd {
	if err := call.ctx.Err(); err != nil {
		return failed(call.ctx, err)
	}
	p.mu.Lock()
	if p.flushers < maxFlushers && len(p.queue) == 0 {
		// Nothing waits and a pipeline slot is free: send it alone, now.
		p.flushers++
		p.mu.Unlock()
		cmd := call.direct(p.Pipeliner)
		p.mu.Lock()
		p.flushers--
		if len(p.queue) > 0 && p.flushers < maxFlushers {
			p.flushers++
			go p.flush()
		}
		p.mu.Unlock()
		return cmd
	}
	s := &pipedScript{scriptCall: call, done: make(chan struct{})}
	p.queue = append(p.queue, s)
	if p.flushers < maxFlushers {
		p.flushers++
		go p.flush()
	}
	p.mu.Unlock()
	select {
	case <-s.done:
		return s.reply
	case <-s.ctx.Done():
		s.canceled.Store(true)
		return failed(s.ctx, s.ctx.Err())
	}
}

// flush sends what is queued, batch after batch, until the queue is empty.
func (p *autoPipeline) flush() {
	for {
		p.mu.Lock()
		if len(p.queue) == 0 {
			p.flushers--
			p.mu.Unlock()
			return
		}
		n := min(len(p.queue), maxBatch)
		batch := p.queue[:n:n]
		p.queue = p.queue[n:]
		if len(p.queue) == 0 {
			p.queue = nil
		}
		p.mu.Unlock()
		p.exec(batch)
	}
}

func (p *autoPipeline) exec(batch []*pipedScript) {
	live := batch[:0:0]
	for _, s := range batch {
		if !s.canceled.Load() {
			live = append(live, s)
		}
	}
	switch len(live) {
	case 0:
		return
	case 1:
		live[0].reply = live[0].direct(p.Pipeliner)
		close(live[0].done)
		return
	}
	pipe := p.Pipeline()
	for _, s := range live {
		s.reply = s.queue(pipe)
	}
	// The pipeline's own deadline is the client's read and write
	// timeouts; each caller waits no longer than its ctx.
	_, _ = pipe.Exec(context.Background())
	for _, s := range live {
		close(s.done)
	}
}

func (s *scriptCall) direct(c redis.Scripter) *redis.Cmd {
	switch {
	case s.eval && s.ro:
		return c.EvalRO(s.ctx, s.script, s.keys, s.args...)
	case s.eval:
		return c.Eval(s.ctx, s.script, s.keys, s.args...)
	case s.ro:
		return c.EvalShaRO(s.ctx, s.script, s.keys, s.args...)
	}
	return c.EvalSha(s.ctx, s.script, s.keys, s.args...)
}

func (s *scriptCall) queue(pipe redis.Pipeliner) *redis.Cmd {
	ctx := context.WithoutCancel(s.ctx)
	switch {
	case s.eval && s.ro:
		return pipe.EvalRO(ctx, s.script, s.keys, s.args...)
	case s.eval:
		return pipe.Eval(ctx, s.script, s.keys, s.args...)
	case s.ro:
		return pipe.EvalShaRO(ctx, s.script, s.keys, s.args...)
	}
	return pipe.EvalSha(ctx, s.script, s.keys, s.args...)
}

func failed(ctx context.Context, err error) *redis.Cmd {
	cmd := redis.NewCmd(ctx)
	cmd.SetErr(err)
	return cmd
}
