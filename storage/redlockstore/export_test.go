package redlockstore

import "time"

// SetClockSkew makes s play a client whose clock runs skew ahead of its
// servers' (the tests of clock independence).
func SetClockSkew(s *Store, skew time.Duration) { s.base.ClockSkew = skew }

// Settle reports whether the node requests s left running in the
// background (the nodes that answered after the majority, and what their
// late answers undo) ended within timeout.
func Settle(s *Store, timeout time.Duration) bool { return s.base.BG.Settle(timeout) }
