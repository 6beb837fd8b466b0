package testenv

import (
	"bytes"
	"net"
	"sync"
	"testing"
	"time"
)

// Proxy forwards TCP connections from its own loopback address to a
// server's. Stall cuts every connection as a partition does: bytes are
// held, not forwarded, and nothing is closed, so a client learns of it only
// by its own timeouts.
type Proxy struct {
	Addr   string // where clients connect
	target string
	ln     net.Listener
	redial time.Duration // how long a connection waits for target to listen

	mu      sync.Mutex
	stalled chan struct{}           // non-nil while stalled; closed by Resume
	trigger func(chunk []byte) bool // StallWhen's or StallAfter's; nil when none is armed
	after   bool                    // the trigger's chunk itself goes through (StallAfter)
	conns   map[net.Conn]struct{}
	wg      sync.WaitGroup
}

// StartProxy starts a proxy to target, closed at tb's cleanup.
func StartProxy(tb testing.TB, target string) *Proxy {
	tb.Helper()
	return startProxy(tb, target, 0)
}

func startProxy(tb testing.TB, target string, redial time.Duration) *Proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p := &Proxy{Addr: ln.Addr().String(), target: target, ln: ln, redial: redial, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	tb.Cleanup(p.close)
	return p
}

// StartPeerProxy is StartProxy for a link between two servers of one
// cluster: a connection accepted while target does not listen yet waits
// up to two seconds for it instead of being closed at once. Without the
// proxy the peer's dial would be refused and retried; an accepted
// connection that closes at once is read as a peer that failed (a
// ZooKeeper follower that dials its new leader before the leader's port
// is open gives up on it and waits out the leader's initLimit).
func StartPeerProxy(tb testing.TB, target string) *Proxy {
	tb.Helper()
	return startProxy(tb, target, 2*time.Second)
}

// Retarget sends the connections accepted from now on to target; those
// open now stay where they are: a proxy that spreads its clients'
// connections over several servers (ProxySQL, HAProxy before a cluster).
func (p *Proxy) Retarget(target string) {
	p.mu.Lock()
	p.target = target
	p.mu.Unlock()
}

// Stall stops forwarding on every connection, present and future.
func (p *Proxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stalled == nil {
		p.stalled = make(chan struct{})
	}
}

// StallWhen stalls the proxy, as Stall does, at the first chunk a client
// sends toward the server for which match is true: that chunk and every
// later one are held until Resume. A test stalls one request of a sequence
// so (a ZooKeeper setData: ZooKeeperOp), the ones before it answered.
func (p *Proxy) StallWhen(match func(chunk []byte) bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.trigger, p.after = match, false
}

// StallAfter is StallWhen, except that the matching chunk reaches the
// server: its answer, and everything after it, is held. A test loses the
// answer to a request the server ran so.
func (p *Proxy) StallAfter(match func(chunk []byte) bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.trigger, p.after = match, true
}

// Contains returns a StallWhen or StallAfter match for a chunk that
// contains b (a request that names a key, say).
func Contains(b []byte) func(chunk []byte) bool {
	return func(chunk []byte) bool { return bytes.Contains(chunk, b) }
}

// ZooKeeperOp returns a StallWhen match for a chunk that starts with a
// ZooKeeper request of type op (the jute header: length, xid, type; 5 is
// setData, 14 multi, 4 getData).
func ZooKeeperOp(op int32) func(chunk []byte) bool {
	return func(b []byte) bool {
		return len(b) >= 12 && int32(uint32(b[8])<<24|uint32(b[9])<<16|uint32(b[10])<<8|uint32(b[11])) == op
	}
}

// Stalled reports whether the proxy holds what it is sent (Stall, or a
// StallWhen or StallAfter that matched).
func (p *Proxy) Stalled() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stalled != nil
}

// WaitStalled waits until the proxy stalls (a StallWhen or StallAfter
// matched), failing tb after timeout.
func (p *Proxy) WaitStalled(tb testing.TB, timeout time.Duration) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for !p.Stalled() {
		if time.Now().After(deadline) {
			tb.Fatalf("proxy to %s: nothing matched within %v", p.target, timeout)
		}
		time.Sleep(time.Millisecond)
	}
}

// Resume forwards again what was held and what comes next.
func (p *Proxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stalled != nil {
		close(p.stalled)
		p.stalled = nil
	}
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go p.connect(c)
	}
}

// connect dials target for c and forwards between them.
func (p *Proxy) connect(c net.Conn) {
	defer p.wg.Done()
	deadline := time.Now().Add(p.redial)
	p.mu.Lock()
	target := p.target
	p.mu.Unlock()
	s, err := net.Dial("tcp", target)
	for err != nil && time.Now().Before(deadline) && p.open() {
		time.Sleep(20 * time.Millisecond)
		s, err = net.Dial("tcp", target)
	}
	if err != nil {
		_ = c.Close()
		return
	}
	if !p.track(c, s) {
		return
	}
	p.wg.Add(2)
	go p.pipe(s, c, true)
	go p.pipe(c, s, false)
}

func (p *Proxy) open() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.conns != nil
}

func (p *Proxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns == nil {
		for _, c := range cs {
			_ = c.Close()
		}
		return false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

// pipe copies from src to dst, holding each chunk while the proxy stalls;
// upstream is the client-to-server direction, where StallWhen looks.
func (p *Proxy) pipe(dst, src net.Conn, upstream bool) {
	defer p.wg.Done()
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			pass := false
			if upstream && p.trigger != nil && p.trigger(buf[:n]) {
				p.trigger = nil
				if p.stalled == nil {
					p.stalled = make(chan struct{})
				}
				pass = p.after
			}
			stalled, open := p.stalled, p.conns != nil
			p.mu.Unlock()
			if pass {
				stalled = nil
			}
			if !open {
				return
			}
			if stalled != nil {
				<-stalled
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // io.EOF or a closed connection: the other side closes too
		}
	}
}

func (p *Proxy) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	conns := p.conns
	p.conns = nil
	if p.stalled != nil {
		close(p.stalled)
		p.stalled = nil
	}
	p.mu.Unlock()
	for c := range conns {
		_ = c.Close()
	}
	p.wg.Wait()
}

// Cut closes every connection open now, as a server or a network that
// drops them does: both sides see them end. New connections are forwarded
// again.
func (p *Proxy) Cut() {
	p.mu.Lock()
	conns := p.conns
	if conns != nil {
		p.conns = map[net.Conn]struct{}{}
	}
	p.mu.Unlock()
	for c := range conns {
		_ = c.Close()
	}
}
