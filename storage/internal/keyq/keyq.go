package keyq

import (
	"container/list"
	"context"
	"sync"
)

// Queue is a set of per-key FIFO mutexes. The zero value is ready to use.
type Queue struct {
	mu sync.Mutex
	m  map[string]*entry
}

type entry struct {
	held    bool
	waiters list.List // of chan struct{} (buffered 1), sent to on hand-off
}

// Lock takes key's slot, waiting first come, first served while another
// goroutine has it. It returns ctx.Err() if ctx ends first.
func (q *Queue) Lock(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	q.mu.Lock()
	if q.m == nil {
		q.m = make(map[string]*entry)
	}
	e := q.m[key]
	if e == nil {
		e = &entry{}
		q.m[key] = e
	}
	if !e.held {
		e.held = true
		q.mu.Unlock()
		return nil
	}
	ch := make(chan struct{}, 1)
	elem := e.waiters.PushBack(ch)
	q.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
	}
	q.mu.Lock()
	select {
	case <-ch: // handed off as ctx ended: pass it on
		q.mu.Unlock()
		q.Unlock(key)
	default:
		e.waiters.Remove(elem)
		q.mu.Unlock()
	}
	return ctx.Err()
}

// TryLock takes key's slot if it is free.
func (q *Queue) TryLock(key string) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.m == nil {
		q.m = make(map[string]*entry)
	}
	if e := q.m[key]; e != nil {
		return false
	}
	q.m[key] = &entry{held: true}
	return true
}

// Unlock hands key's slot to the longest waiter, or frees it.
func (q *Queue) Unlock(key string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	e := q.m[key]
	if e == nil {
		panic("keyq: Unlock of a key that is not locked")
	}
	if front := e.waiters.Front(); front != nil {
		e.waiters.Remove(front).(chan struct{}) <- struct{}{}
		return
	}
	delete(q.m, key)
}
