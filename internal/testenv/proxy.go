package testenv

import (
	"net"
	"sync"
	"testing"
)

// Proxy forwards TCP connections from its own loopback address to a
// server's. Stall cuts every connection as a partition does: bytes are
// held, not forwarded, and nothing is closed, so a client learns of it only
// by its own timeouts.
type Proxy struct {
	Addr   string // where clients connect
	target string
	ln     net.Listener

	mu      sync.Mutex
	stalled chan struct{} // non-nil while stalled; closed by Resume
	conns   map[net.Conn]struct{}
	wg      sync.WaitGroup
}

// StartProxy starts a proxy to target, closed at tb's cleanup.
func StartProxy(tb testing.TB, target string) *Proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p := &Proxy{Addr: ln.Addr().String(), target: target, ln: ln, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	tb.Cleanup(p.close)
	return p
}

// Stall stops forwarding on every connection, present and future.
func (p *Proxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stalled == nil {
		p.stalled = make(chan struct{})
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
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		if !p.track(c, s) {
			return
		}
		p.wg.Add(2)
		go p.pipe(s, c)
		go p.pipe(c, s)
	}
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

// pipe copies from src to dst, holding each chunk while the proxy stalls.
func (p *Proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			stalled, open := p.stalled, p.conns != nil
			p.mu.Unlock()
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
