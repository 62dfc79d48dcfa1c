package etcdtest

import (
	"io"
	"net"
	"sync"
)

// Proxy forwards TCP connections on a 127.0.0.1 port to a target address until cut: the
// network between a node and etcd, which a test takes away (Cut(true): every connection
// closed, new ones closed at once) and gives back (Cut(false)). Any goroutine.
type Proxy struct {
	l      net.Listener
	target string
	mu     sync.Mutex
	cut    bool
	conns  map[net.Conn]bool
	wg     sync.WaitGroup
}

// NewProxy listens on 127.0.0.1:0 and forwards to target (host:port).
func NewProxy(target string) (*Proxy, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{l: l, target: target, conns: make(map[net.Conn]bool)}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.l.Addr().String() }

// Endpoint is the proxy's URL for an etcd client.
func (p *Proxy) Endpoint() string { return "http://" + p.Addr() }

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.cut {
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.mu.Unlock()
		u, err := net.Dial("tcp", p.target)
		p.mu.Lock()
		if err != nil || p.cut {
			p.mu.Unlock()
			c.Close()
			if u != nil {
				u.Close()
			}
			continue
		}
		p.conns[c], p.conns[u] = true, true
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pipe(c, u)
		go p.pipe(u, c)
	}
}

func (p *Proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	io.Copy(dst, src)
	dst.Close()
	src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}

// Cut takes the network away (true: every connection is closed, and new ones at once) or
// gives it back (false).
func (p *Proxy) Cut(cut bool) {
	p.mu.Lock()
	p.cut = cut
	if cut {
		for c := range p.conns {
			c.Close()
		}
	}
	p.mu.Unlock()
}

// Close stops the proxy and waits for its goroutines.
func (p *Proxy) Close() {
	p.l.Close()
	p.Cut(true)
	p.wg.Wait()
}
