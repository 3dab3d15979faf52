// Package cutproxy is a loopback TCP proxy for tests whose connections can
// all be cut at once, like a network link that drops: no close frame, no
// FIN from the far side, just gone.
package cutproxy

import (
	"io"
	"net"
	"sync"
	"testing"
)

// Proxy relays every accepted connection to a target address. Its
// goroutines are joined when the test ends.
type Proxy struct {
	ln     net.Listener
	target string

	mu       sync.Mutex
	conns    []net.Conn
	accepted int
	wg       sync.WaitGroup
}

// Start listens on a loopback port and relays to target until tb ends.
func Start(tb testing.TB, target string) *Proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p := &Proxy{ln: ln, target: target}
	p.wg.Go(p.accept)
	tb.Cleanup(func() { ln.Close(); p.Cut(); p.wg.Wait() })
	return p
}

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.accepted++
		p.conns = append(p.conns, c, up)
		p.mu.Unlock()
		p.wg.Go(func() { io.Copy(up, c); up.Close() })
		p.wg.Go(func() { io.Copy(c, up); c.Close() })
	}
}

// Cut closes every relayed connection, both sides, at once.
func (p *Proxy) Cut() {
	p.mu.Lock()
	conns := p.conns
	p.conns = nil
	p.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
}

// Accepts is how many connections the proxy has relayed.
func (p *Proxy) Accepts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

// Addr is the proxy's listen address (host:port).
func (p *Proxy) Addr() string { return p.ln.Addr().String() }
