package redlockstore

import (
	"errors"
	"fmt"
	"slices"
	"strings"
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
	return fmt.Sprintf("redlockstore: %s %q: no quorum: %d of %d needed nodes; failed: %s",
		e.Op, e.Key, e.Got, e.Need, strings.Join(parts, "; "))
}

// Is reports whether target is ErrNoQuorum.
func (e *QuorumError) Is(target error) bool { return target == ErrNoQuorum }

var (
	errNodeTimeout = errors.New("no answer within the node timeout")
	errLate        = errors.New("request reached the node after its deadline")
)
