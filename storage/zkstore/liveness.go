package zkstore

import (
	"errors"
	"time"

	"github.com/go-zookeeper/zk"
)

// The Store's liveness clock. Leases end when the client reports the
// connection lost (onEvent), but the client can report it late: a send
// blocked in a large write holds back its pings and its read deadline,
// up to about 4/3 of the session timeout, after the servers may have
// expired the session and handed its keys on. So the Store keeps its own
// clock: while it holds leases it asks the ensemble something cheap every
// sixth of the session timeout, and when nothing at all was answered for
// two thirds of it, every lease ends, as on a disconnection.

// pingFunc is the liveness request.
type pingFunc func(path string) (bool, *zk.Stat, error)

// noteAnswer records that the ensemble answered a request now.
func (s *Store) noteAnswer() { s.answered.Store(time.Now().UnixNano()) }

// answerErr reports an error that is the ensemble's answer (the request
// reached a server and came back), not a lost connection.
func answerErr(err error) bool {
	return err == nil || errors.Is(err, zk.ErrNoNode) || errors.Is(err, zk.ErrNodeExists) ||
		errors.Is(err, zk.ErrBadVersion) || errors.Is(err, zk.ErrNotEmpty) || errors.Is(err, zk.ErrNoChildrenForEphemerals)
}

// silence is how long nothing may be answered while leases are held.
func (s *Store) silence() time.Duration { return 2 * s.timeout / 3 }

// startLiveness runs the liveness clock until Close.
func (s *Store) startLiveness() {
	s.noteAnswer()
	tick := s.timeout / 6
	s.livenessDone = make(chan struct{})
	go func() {
		defer close(s.livenessDone)
		t := time.NewTicker(tick)
		defer t.Stop()
		pinging := make(chan struct{}, 1) // one ping at a time
		for {
			select {
			case <-s.closing:
				return
			case <-t.C:
			}
			s.mu.Lock()
			held := len(s.leases) > 0
			s.mu.Unlock()
			if !held {
				continue
			}
			if time.Since(time.Unix(0, s.answered.Load())) > s.silence() {
				s.endAll()
				s.sweep() // the ended leases' nodes, once requests get through again
				continue
			}
			select {
			case pinging <- struct{}{}:
				s.bg.Go(func() {
					defer func() { <-pinging }()
					if _, _, err := (*s.ping.Load())(s.root); answerErr(err) {
						s.noteAnswer()
					}
				})
			default:
			}
		}
	}()
}
