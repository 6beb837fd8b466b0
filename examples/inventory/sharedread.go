package inventory

import (
	"context"
	"sync"
	"time"
)

// sharedReads lets the concurrent reads of one key share a query: in a
// flash sale thousands of buyers read one SKU's stock at once, and on SQL
// each read is a statement — a round trip and a wake-up of a database
// backend — where the answer is the same. A read that arrives while the
// key's query is in flight joins the next one, which starts as soon as
// that query ends: every answer was read after its caller arrived, never
// before (a query already in flight may have been sent before). One query
// per key is in flight at a time.
type sharedReads[V any] struct {
	mu   sync.Mutex
	keys map[string]*sharedKey[V]
}

type sharedKey[V any] struct {
	busy bool           // a query is in flight
	next *sharedRead[V] // the query after it, with the callers that wait for it
}

type sharedRead[V any] struct {
	done chan struct{}
	v    V
	err  error
}

// readTimeout bounds a shared query, which runs for several callers.
const readTimeout = 10 * time.Second

// read returns query's answer for key from a query that started after
// this call did, shared with the calls of key that wait for the same one.
func (s *sharedReads[V]) read(ctx context.Context, key string, query func(context.Context) (V, error)) (V, error) {
	s.mu.Lock()
	if s.keys == nil {
		s.keys = map[string]*sharedKey[V]{}
	}
	k := s.keys[key]
	if k == nil {
		k = &sharedKey[V]{}
		s.keys[key] = k
	}
	if !k.busy {
		// Nothing in flight: this caller's query, on its own context.
		k.busy = true
		s.mu.Unlock()
		v, err := query(ctx)
		s.finish(key, k, query)
		return v, err
	}
	r := k.next
	if r == nil {
		r = &sharedRead[V]{done: make(chan struct{})}
		k.next = r
	}
	s.mu.Unlock()
	select {
	case <-r.done:
		return r.v, r.err
	case <-ctx.Done():
		var zero V
		return zero, ctx.Err()
	}
}

// finish ends key's query in flight and starts the next one, if callers
// wait for it; the key is forgotten once nothing is in flight or waiting.
func (s *sharedReads[V]) finish(key string, k *sharedKey[V], query func(context.Context) (V, error)) {
	s.mu.Lock()
	r := k.next
	k.next = nil
	if r == nil {
		k.busy = false
		delete(s.keys, key)
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), readTimeout)
		r.v, r.err = query(ctx)
		cancel()
		close(r.done)
		s.finish(key, k, query)
	}()
}
