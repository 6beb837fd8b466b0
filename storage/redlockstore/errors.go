package redlockstore

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/oncekit/oncekit/core/lock"
)

// ErrNoQuorum reports that a majority of the nodes could not be reached
// (down, paused, timed out), so the operation could not be decided. It is
// never reported as a success: an Acquire that fails with it holds nothing.
var ErrNoQuorum = errors.New("redlockstore: no quorum")

// QuorumError is the detailed form of ErrNoQuorum: which nodes failed and
// why. It matches ErrNoQuorum with errors.Is.
type QuorumError struct {
	Op     string           // "acquire", "refresh", "release"
	Key    string           // the lock key
	Need   int              // the quorum
	Got    int              // nodes that answered as needed
	Failed map[string]error // node name -> what went wrong
}

func (e *QuorumError) Error() string {
	names := make([]string, 0, len(e.Failed))
	for n := range e.Failed {
		names = append(names, n)
	}
	slices.Sort(names)
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = fmt.Sprintf("%s: %v", n, e.Failed[n])
	}
	what := e.Op
	if e.Key != "" {
		what = fmt.Sprintf("%s %q", e.Op, e.Key) // (ping has none)
	}
	return fmt.Sprintf("redlockstore: %s: no quorum: %d of %d needed nodes; failed: %s",
		what, e.Got, e.Need, strings.Join(parts, "; "))
}

// Is reports whether target is ErrNoQuorum.
func (e *QuorumError) Is(target error) bool { return target == ErrNoQuorum }

// ErrClockSkew reports that an acquisition (or claim) was refused because
// its fence ran more than half the TTL ahead of a taken node's clock: the
// nodes' clocks disagree by that much (or one stepped back), and the fence
// could not be shown to stay above every earlier one once the hold
// expires. Nothing is held. Synchronise the nodes' clocks (NTP).
var ErrClockSkew = errors.New("redlockstore: node clocks disagree")

// ClockSkewError is the detailed form of ErrClockSkew. It matches
// ErrClockSkew and lock.ErrNotAcquired with errors.Is.
type ClockSkewError struct {
	Op    string        // "acquire", "begin"
	Key   string        // the lock or idempotency key
	Node  string        // the node whose clock was furthest behind
	Ahead time.Duration // how far the fence ran ahead of its clock
	TTL   time.Duration
}

func (e *ClockSkewError) Error() string {
	return fmt.Sprintf("redlockstore: %s %q: node clocks disagree: the fence runs %s ahead of %s's clock, more than half the %s TTL",
		e.Op, e.Key, e.Ahead.Round(time.Millisecond), e.Node, e.TTL)
}

// Is reports whether target is ErrClockSkew or lock.ErrNotAcquired.
func (e *ClockSkewError) Is(target error) bool {
	return target == ErrClockSkew || target == lock.ErrNotAcquired
}

var (
	errNodeTimeout = errors.New("no answer within the node timeout")
	errLate        = errors.New("request reached the node after its deadline")
)
