package txnode

import (
	"net"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// acceptPairs is the accept loop of the tests' TCP proxies: for each connection accepted on
// ln it dials target and hands both ends to pair (client side, node side). It runs until ln
// is closed, counted in wg.
func acceptPairs(ln net.Listener, target string, wg *sync.WaitGroup, pair func(c, s net.Conn)) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			pair(c, s)
		}
	}()
}

// proxyConns is what the tests' forwarding proxies share: the listener, both ends of every
// connection forwarded, and the goroutines piping between them.
type proxyConns struct {
	ln    net.Listener
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns []net.Conn
}

// listenLoopback listens on a free loopback port, failing the test on error.
func listenLoopback(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	return ln
}

// add records a forwarded pair (client side c, node side s) and counts its two pipes, which
// the caller starts, in wg.
func (p *proxyConns) add(c, s net.Conn) {
	p.mu.Lock()
	p.conns = append(p.conns, c, s)
	p.mu.Unlock()
	p.wg.Add(2)
}

// closeConns closes every forwarded connection and waits for the pipes.
func (p *proxyConns) closeConns() {
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// close closes the listener, then every forwarded connection, and waits for the pipes.
func (p *proxyConns) close() {
	p.ln.Close()
	p.closeConns()
}

// forward copies src to dst in chunks of up to 64 KiB until either fails, calling before
// (when set) ahead of each chunk's write; it closes neither side. The caller counted it in
// wg (add).
func (p *proxyConns) forward(dst, src net.Conn, before func()) {
	defer p.wg.Done()
	buf := make([]byte, 64<<10)
	for {
		k, err := src.Read(buf)
		if k > 0 {
			if before != nil {
				before()
			}
			if _, werr := dst.Write(buf[:k]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
