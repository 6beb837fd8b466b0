package rediskit

import (
	"testing"
	"time"
)

// A clock reading's floor is never above the server's clock: at most the
// reading plus the time passed here since its reply came, and at least the
// reading.
func TestClockReadingFloor(t *testing.T) {
	if f := (ClockReading{}).Floor(); f != 0 {
		t.Errorf("no reading: floor %d, want 0", f)
	}
	if f := ReadClock(0).Floor(); f != 0 {
		t.Errorf("a reading of 0: floor %d, want 0", f)
	}
	const us = 1_700_000_000_000_000
	r := ReadClock(us)
	if f := r.Floor(); f < us || f > us+time.Since(r.At).Microseconds() {
		t.Errorf("floor just after the reading: %d, want within [%d, reading + elapsed]", f, us)
	}
	r.At = time.Now().Add(-time.Second)
	f, passed := r.Floor(), time.Since(r.At).Microseconds()
	if f > us+passed || f < us+passed*98/100 {
		t.Errorf("floor a second after the reply: %d µs past the reading, want between 98 and 100 %% of %d", f-us, passed)
	}
}
