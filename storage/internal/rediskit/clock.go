package rediskit

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// A deadline sent to a script is compared with the server's clock (TIME):
// that is how a request that reaches a paused or slow server too late
// takes nothing. A client's clock may be off from the server's by seconds,
// so a deadline is never sent as the client wrote it: it is moved onto the
// server's clock by an offset measured with TIME (once per client, again
// every clockRefresh, in the background). Until the first measurement a
// script gets no deadline, and the caller's own timeout and clean-up
// cover the late request.
const clockRefresh = time.Minute

// clock is what is known of one server's clock.
type clock struct {
	offset   atomic.Int64 // server − client, ns
	measured atomic.Int64 // when (client clock, Unix ns); 0: never
	busy     atomic.Bool
}

// timer is the part of a client that reads the server's clock.
type timer interface {
	Time(ctx context.Context) *redis.TimeCmd
}

// clocks holds one clock per client (node).
type clocks struct {
	m sync.Map // redis.Scripter -> *clock
}

// now is the client's clock: time.Now, shifted in tests that play a
// client whose clock is off (Base.ClockSkew).
func (b *Base) now() time.Time { return time.Now().Add(b.ClockSkew) }

// ServerDeadline converts a deadline on this client's clock to Unix
// milliseconds on c's clock, or 0 (no deadline) when d is zero or the
// offset is not known yet.
func (b *Base) ServerDeadline(c redis.Scripter, d time.Time) int64 {
	if d.IsZero() {
		return 0
	}
	v, _ := b.clocks.m.LoadOrStore(c, &clock{})
	ck := v.(*clock)
	at := ck.measured.Load()
	if at == 0 || b.now().Sub(time.Unix(0, at)) > clockRefresh {
		b.measure(c, ck)
	}
	if at == 0 {
		return 0
	}
	return d.Add(b.ClockSkew).Add(time.Duration(ck.offset.Load())).UnixMilli()
}

// measure reads c's clock in the background: offset = server time − the
// client's time half-way through the request.
func (b *Base) measure(c redis.Scripter, ck *clock) {
	tc, ok := c.(timer)
	if !ok || !ck.busy.CompareAndSwap(false, true) {
		return
	}
	b.BG.Go(func() {
		defer ck.busy.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		sent := b.now()
		server, err := tc.Time(ctx).Result()
		if err != nil {
			return
		}
		rtt := b.now().Sub(sent)
		ck.offset.Store(int64(server.Sub(sent.Add(rtt / 2))))
		ck.measured.Store(b.now().UnixNano())
	})
}

// A ClockReading is a server's clock in microseconds, as a script reported
// it (AcquireReply.Clock), and when its reply reached this process. The
// zero ClockReading is no reading.
type ClockReading struct {
	US int64     // the server's clock, µs; 0: none
	At time.Time // when the reply came (with the monotonic reading)
}

// ReadClock is a reading of us taken from a reply received now.
func ReadClock(us int64) ClockReading {
	if us <= 0 {
		return ClockReading{}
	}
	return ClockReading{US: us, At: time.Now()}
}

// Floor is a lower bound on the server's clock now, in µs, for a release
// to skip reading it (Base.Release's clock): the reading, plus the time
// that has passed here since its reply came less 1 % (clock rates differ
// by far less; a reading older than its reply is already allowed for).
// It assumes what the fences already do: the server's clock does not step
// back. 0 for no reading.
func (c ClockReading) Floor() int64 {
	if c.US <= 0 {
		return 0
	}
	d := time.Since(c.At)
	if d <= 0 {
		return c.US
	}
	return c.US + (d - d/100).Microseconds()
}
