package etcdstore

import (
	"context"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// queueWatch is one long-lived watch on a lock's queue directory, shared
// by all of the Store's waiters for that key, which dispatches each delete
// to the waiter whose predecessor was deleted.
//
// Why not a watch per waiter: etcd serves a watch that starts at an older
// revision from its "unsynced" group, which a loop catches up every
// 100 ms, and a watch created without a revision starts at the revision the
// server had a moment before — under contention, other waiters' writes
// make that the past. A watch that stays open keeps up with the stream of
// events once it has caught up, so hand-offs arrive at once.
type queueWatch struct {
	s      *Store
	pfx    string
	cancel context.CancelFunc
	ready  chan struct{} // closed once the watch is created

	users users // closes the watch a while after its last waiter left

	mu      sync.Mutex
	waiters map[string][]chan struct{} // entry key -> waiters for its deletion
	broken  bool                       // the watch ended: waiters must check again
}

// queueWatchFor returns the Store's watch on pfx, creating it; release it
// with put.
func (s *Store) queueWatchFor(pfx string) *queueWatch {
	s.qmu.Lock()
	defer s.qmu.Unlock()
	if s.queues == nil {
		s.queues = map[string]*queueWatch{}
	}
	q := s.queues[pfx]
	if q == nil {
		ctx, cancel := context.WithCancel(context.Background())
		q = &queueWatch{s: s, pfx: pfx, cancel: cancel, ready: make(chan struct{}), waiters: map[string][]chan struct{}{}}
		s.queues[pfx] = q
		s.bg.Go(func() { q.run(ctx) })
	}
	q.users.add()
	return q
}

// queueLinger is how long a watch stays open after its last waiter left: a
// key that is contended now is likely contended again soon, and a fresh
// watch may start out unsynced.
const queueLinger = 2 * time.Second

// users counts the waiters of a shared watch, under Store.qmu; when the
// last one leaves, the watch is dropped queueLinger later unless another
// came meanwhile.
type users struct {
	n      int
	linger *time.Timer
}

func (u *users) add() {
	if u.linger != nil {
		u.linger.Stop()
		u.linger = nil
	}
	u.n++
}

// done counts one user out; drop runs under mu once the watch lingered
// unused. The caller holds mu.
func (u *users) done(mu *sync.Mutex, drop func()) {
	u.n--
	if u.n > 0 {
		return
	}
	u.linger = time.AfterFunc(queueLinger, func() {
		mu.Lock()
		defer mu.Unlock()
		if u.n == 0 {
			drop()
		}
	})
}

// stop ends the linger (Close); the caller holds Store.qmu.
func (u *users) stop() {
	if u.linger != nil {
		u.linger.Stop()
	}
}

func (q *queueWatch) put() {
	q.s.qmu.Lock()
	defer q.s.qmu.Unlock()
	q.users.done(&q.s.qmu, func() {
		if q.s.queues[q.pfx] == q {
			delete(q.s.queues, q.pfx)
			q.cancel()
		}
	})
}

// closeQueues ends every queue watch (Close).
func (s *Store) closeQueues() {
	s.qmu.Lock()
	defer s.qmu.Unlock()
	for pfx, q := range s.queues {
		q.users.stop()
		q.cancel()
		delete(s.queues, pfx)
	}
}

// run keeps the watch open until cancelled, recreating it after errors.
func (q *queueWatch) run(ctx context.Context) {
	readyOnce := sync.OnceFunc(func() { close(q.ready) })
	defer readyOnce()
	for ctx.Err() == nil {
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		wch := q.s.c.Watch(wctx, q.pfx, clientv3.WithPrefix(), clientv3.WithFilterPut(), clientv3.WithCreatedNotify())
		for wr := range wch {
			if wr.Err() != nil {
				break
			}
			if wr.Created {
				q.mu.Lock()
				q.broken = false
				q.mu.Unlock()
				readyOnce()
			}
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypeDelete {
					q.deleted(string(ev.Kv.Key))
				}
			}
		}
		cancel()
		// The watch ended: events may have been missed, so every waiter
		// looks again.
		q.wakeAll()
		select {
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
		}
	}
}

func (q *queueWatch) deleted(key string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, ch := range q.waiters[key] {
		close(ch)
	}
	delete(q.waiters, key)
}

func (q *queueWatch) wakeAll() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.broken = true
	for key, chs := range q.waiters {
		for _, ch := range chs {
			close(ch)
		}
		delete(q.waiters, key)
	}
}

// register returns a channel closed when key is deleted (or when the watch
// broke and the caller must look again).
func (q *queueWatch) register(key string) <-chan struct{} {
	q.mu.Lock()
	defer q.mu.Unlock()
	ch := make(chan struct{})
	if q.broken {
		close(ch)
		return ch
	}
	q.waiters[key] = append(q.waiters[key], ch)
	return ch
}

func (q *queueWatch) unregister(key string, ch <-chan struct{}) {
	q.mu.Lock()
	defer q.mu.Unlock()
	chs := q.waiters[key]
	for i, c := range chs {
		if c == ch {
			q.waiters[key] = append(chs[:i], chs[i+1:]...)
			break
		}
	}
	if len(q.waiters[key]) == 0 {
		delete(q.waiters, key)
	}
}
