package etcdstore

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Heartbeats: freeing a dead holder's key in TTL, not in TTL + 0.5 s.
//
// etcd frees the keys of an expired lease when its leader's lessor gets
// round to it — it looks every 500 ms — so a dead holder's key used to come
// free 1.0 to 1.5 TTLs after its last keep-alive. A waiter cannot ask the
// server whether a lease is past its expiry (LeaseTimeToLive counts in
// whole seconds and reads 0 through a live lease's last second), and it
// must not compare its clock with the holder's.
//
// So every session also writes a heartbeat, "<prefix>\x00session/<lease in
// hex>" (the NUL keeps it outside every lock directory), bound to the
// session lease, holding the lease's TTL in milliseconds. The holder
// rewrites it after every keep-alive that succeeded and counts the
// session's validity only from keep-alives whose heartbeat was written:
// validity = (when the keep-alive was sent) + TTL, and that send came
// before the heartbeat's write committed.
//
// A waiter whose predecessor belongs to a session knows when it last saw
// that session's heartbeat change — through one watch per Store on every
// heartbeat, or from a read — and the change committed before it saw it.
// So once TTL (plus a drift margin) has passed since it saw the latest
// heartbeat, the holder's validity has run out by the holder's own clock,
// measured on its side from an earlier instant. The waiter then deletes
// the predecessor's entry in a transaction conditional on the heartbeat's
// mod revision being the one it saw: a heartbeat written meanwhile, even
// one whose answer the holder never got, makes the delete a no-op. Only
// elapsed times on each side are used, never one clock against another.

// heartbeatDir is the directory of the sessions' heartbeats.
func (s *Store) heartbeatDir() string { return s.opts.prefix + "\x00session/" }

// heartbeatKey is session id's heartbeat.
func (s *Store) heartbeatKey(id clientv3.LeaseID) string {
	return s.heartbeatDir() + strconv.FormatInt(int64(id), 16)
}

// entryLease is the session lease that entry (a key in a lock directory,
// "<dir><lease in hex>-<token>") is bound to; false when the name does not
// say.
func entryLease(pfx, entry string) (clientv3.LeaseID, bool) {
	name, ok := strings.CutPrefix(entry, pfx)
	if !ok {
		return 0, false
	}
	hex, _, ok := strings.Cut(name, "-")
	if !ok {
		return 0, false
	}
	id, err := strconv.ParseInt(hex, 16, 64)
	if err != nil || id <= 0 {
		return 0, false
	}
	return clientv3.LeaseID(id), true
}

// beat writes sess's heartbeat. An error that says the lease is gone ends
// nothing here: the caller decides.
func (s *Store) beat(ctx context.Context, id clientv3.LeaseID, ttl time.Duration) error {
	_, err := s.c.Put(ctx, s.heartbeatKey(id), strconv.FormatInt(ttl.Milliseconds(), 10), clientv3.WithLease(id))
	return err
}

// staleMargin is what a waiter adds to a session's TTL before it takes the
// session for dead: the two machines' clocks may run at slightly different
// rates, and the holder notices its session's end a moment after it.
func staleMargin(ttl time.Duration) time.Duration { return ttl/50 + 10*time.Millisecond }

// beatSeen is the latest heartbeat of one session that a waiter knows of.
type beatSeen struct {
	rev  int64         // its mod revision
	seen time.Time     // when it was seen here (it committed before)
	ttl  time.Duration // the session's TTL, from its value
}

// deadline is when the session is dead unless it beat again.
func (b beatSeen) deadline() time.Time { return b.seen.Add(b.ttl + staleMargin(b.ttl)) }

// beatWatch is one watch per Store on every session's heartbeat, open
// while waiters use it and for a while after (like queueWatch), which
// records when each heartbeat was last seen to change.
type beatWatch struct {
	s      *Store
	cancel context.CancelFunc
	users  users

	mu    sync.Mutex
	live  bool // the watch is created and unbroken: beats is current
	beats map[clientv3.LeaseID]beatSeen
}

// beatWatchFor returns the Store's heartbeat watch, starting it; release it
// with put.
func (s *Store) beatWatchFor() *beatWatch {
	s.qmu.Lock()
	defer s.qmu.Unlock()
	w := s.beats
	if w == nil {
		ctx, cancel := context.WithCancel(context.Background())
		w = &beatWatch{s: s, cancel: cancel, beats: map[clientv3.LeaseID]beatSeen{}}
		s.beats = w
		s.bg.Go(func() { w.run(ctx) })
	}
	w.users.add()
	return w
}

func (w *beatWatch) put() {
	w.s.qmu.Lock()
	defer w.s.qmu.Unlock()
	w.users.done(&w.s.qmu, func() {
		if w.s.beats == w {
			w.s.beats = nil
			w.cancel()
		}
	})
}

// closeBeats ends the heartbeat watch (Close).
func (s *Store) closeBeats() {
	s.qmu.Lock()
	defer s.qmu.Unlock()
	if w := s.beats; w != nil {
		w.users.stop()
		w.cancel()
		s.beats = nil
	}
}

// run keeps the watch open until cancelled, recreating it after errors;
// while it is down, what it recorded is forgotten (waiters read instead).
func (w *beatWatch) run(ctx context.Context) {
	for ctx.Err() == nil {
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		wch := w.s.c.Watch(wctx, w.s.heartbeatDir(), clientv3.WithPrefix(), clientv3.WithCreatedNotify())
		for wr := range wch {
			if wr.Err() != nil {
				break
			}
			now := time.Now()
			w.mu.Lock()
			if wr.Created {
				w.live = true
			}
			for _, ev := range wr.Events {
				id, ok := w.s.beatLease(string(ev.Kv.Key))
				if !ok {
					continue
				}
				if ev.Type == clientv3.EventTypeDelete {
					delete(w.beats, id)
					continue
				}
				if ttl, ok := beatTTL(ev.Kv.Value); ok {
					w.beats[id] = beatSeen{rev: ev.Kv.ModRevision, seen: now, ttl: ttl}
				}
			}
			w.mu.Unlock()
		}
		cancel()
		w.mu.Lock()
		w.live = false
		clear(w.beats)
		w.mu.Unlock()
		select {
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
		}
	}
}

// latest returns what the watch knows of id's heartbeat.
func (w *beatWatch) latest(id clientv3.LeaseID) (beatSeen, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	b, ok := w.beats[id]
	return b, ok && w.live
}

// beatLease is the session whose heartbeat key is key.
func (s *Store) beatLease(key string) (clientv3.LeaseID, bool) {
	hex, ok := strings.CutPrefix(key, s.heartbeatDir())
	if !ok {
		return 0, false
	}
	id, err := strconv.ParseInt(hex, 16, 64)
	return clientv3.LeaseID(id), err == nil && id > 0
}

func beatTTL(v []byte) (time.Duration, bool) {
	ms, err := strconv.ParseInt(string(v), 10, 64)
	if err != nil || ms <= 0 {
		return 0, false
	}
	return time.Duration(ms) * time.Millisecond, true
}

// lastBeat returns the latest heartbeat of id known here: the watch's, or
// else one read now (seen: when the answer came). ok is false when the
// session has no heartbeat (it is gone, or its Store predates them).
func (s *Store) lastBeat(ctx context.Context, w *beatWatch, id clientv3.LeaseID) (beatSeen, bool, error) {
	if b, ok := w.latest(id); ok {
		return b, true, nil
	}
	resp, err := s.c.Get(ctx, s.heartbeatKey(id))
	if err != nil {
		return beatSeen{}, false, err
	}
	now := time.Now()
	if len(resp.Kvs) == 0 {
		return beatSeen{}, false, nil
	}
	ttl, ok := beatTTL(resp.Kvs[0].Value)
	if !ok {
		return beatSeen{}, false, nil
	}
	b := beatSeen{rev: resp.Kvs[0].ModRevision, seen: now, ttl: ttl}
	if wb, ok := w.latest(id); ok && wb.rev >= b.rev {
		return wb, true, nil // the watch caught up meanwhile
	}
	return b, true, nil
}

// reapIfDead deletes entry, bound to session id, if the heartbeat b is
// still the session's latest: its holder's validity has run out. Otherwise
// it returns the newer heartbeat. reaped is true when the entry was
// deleted (or was already gone).
func (s *Store) reapIfDead(ctx context.Context, id clientv3.LeaseID, entry string, b beatSeen) (newer beatSeen, reaped bool, err error) {
	hb := s.heartbeatKey(id)
	resp, err := s.c.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(hb), "=", b.rev)).
		Then(clientv3.OpDelete(entry)).
		Else(clientv3.OpGet(hb)).
		Commit()
	if err != nil {
		return beatSeen{}, false, err
	}
	now := time.Now()
	if resp.Succeeded {
		return beatSeen{}, true, nil
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return beatSeen{}, true, nil // the session is gone, and its entries with it
	}
	ttl, ok := beatTTL(kvs[0].Value)
	if !ok {
		ttl = b.ttl
	}
	return beatSeen{rev: kvs[0].ModRevision, seen: now, ttl: ttl}, false, nil
}
