package redlockstore

import "time"

// SetClockSkew makes s play a client whose clock runs skew ahead of its
// servers' (the tests of clock independence).
func SetClockSkew(s *Store, skew time.Duration) { s.base.ClockSkew = skew }
