package sqlstore

import (
	"context"
	"database/sql"
	"encoding/hex"
	"hash/fnv"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
)

// The wake-ups of waiters. A release wakes the key's first queued waiter,
// and an abandon or completion wakes the record's waiters, in this process
// at once; on PostgreSQL with pgx it also sends NOTIFY <table>, <waiter>
// (or <hash of the record's key>) in its transaction, which one LISTEN
// connection per Store turns into the same wake-up in every other process.
// Where there is no notification (MySQL, another PostgreSQL driver, a
// LISTEN connection being re-established), waiters poll.

// keyHash is the NOTIFY payload for key: short, fixed-size, any bytes.
func keyHash(key string) string {
	h := fnv.New64a()
	h.Write([]byte(key))
	return hex.EncodeToString(h.Sum(nil))
}

type hubKey struct{ channel, hash string }

// hub fans wake-ups out to the goroutines waiting on a key.
type hub struct {
	mu      sync.Mutex
	waiting map[hubKey]map[chan struct{}]struct{}
}

func newHub() *hub { return &hub{waiting: map[hubKey]map[chan struct{}]struct{}{}} }

// subscribe returns a channel that wake(channel, id) closes, and a
// function that unsubscribes it. A lock waiter's id is its own (a release
// wakes the first waiter only); a record's waiters share keyHash(key).
func (h *hub) subscribe(channel, id string) (<-chan struct{}, func()) {
	k := hubKey{channel, id}
	ch := make(chan struct{})
	h.mu.Lock()
	m := h.waiting[k]
	if m == nil {
		m = map[chan struct{}]struct{}{}
		h.waiting[k] = m
	}
	m[ch] = struct{}{}
	h.mu.Unlock()
	return ch, func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		if m := h.waiting[k]; m != nil {
			delete(m, ch)
			if len(m) == 0 {
				delete(h.waiting, k)
			}
		}
	}
}

func (h *hub) wake(channel, hash string) {
	k := hubKey{channel, hash}
	h.mu.Lock()
	defer h.mu.Unlock()
	for ch := range h.waiting[k] {
		close(ch)
	}
	delete(h.waiting, k)
}

// wakeAll wakes every waiter: the LISTEN connection was lost (a
// notification may have been missed) or the Store closes.
func (h *hub) wakeAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for k, m := range h.waiting {
		for ch := range m {
			close(ch)
		}
		delete(h.waiting, k)
	}
}

// wakeRecord wakes the waiters of a record in this process.
func (s *Store) wakeRecord(key string) {
	_, _, records := s.Tables()
	s.hub.wake(records, keyHash(key))
}

// listenLoop keeps one connection LISTENing on the Store's channels and
// turns notifications into wake-ups, re-connecting with backoff.
func (s *Store) listenLoop() {
	locks, _, records := s.Tables()
	backoff := 50 * time.Millisecond
	for {
		err := s.listenOnce(locks, records)
		s.hub.wakeAll() // anything may have been missed meanwhile
		if err == nil {
			return // stopped
		}
		select {
		case <-s.stop:
			return
		case <-time.After(backoff + rand.N(backoff)):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// listenOnce listens until the Store stops (nil) or the connection fails.
func (s *Store) listenOnce(channels ...string) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-s.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	err = conn.Raw(func(dc any) error {
		pc := dc.(*stdlib.Conn).Conn()
		for _, ch := range channels {
			if _, err := pc.Exec(ctx, `LISTEN "`+ch+`"`); err != nil {
				return err
			}
		}
		s.hub.wakeAll() // listening now: look again at what changed before
		for {
			n, err := pc.WaitForNotification(ctx)
			if err != nil {
				return err
			}
			s.hub.wake(n.Channel, n.Payload)
		}
	})
	select {
	case <-s.stop:
		// The connection was interrupted mid-wait: do not hand it back
		// to the pool.
		return nil
	default:
		if err == nil {
			err = sql.ErrConnDone
		}
		return err
	}
}

// pollDelay is the n-th sleep of a waiter that nothing woke: 2 ms doubling
// to the poll interval, with ±25 % jitter so that waiters spread out.
func (s *Store) pollDelay(n int) time.Duration {
	d := s.pollInterval
	if n < 16 {
		d = min(d, (2*time.Millisecond)<<n)
	}
	return d*3/4 + rand.N(d/2+1)
}
