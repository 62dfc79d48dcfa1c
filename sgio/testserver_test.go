package sgio

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/base"
)

// testServer is a small storage-node stand-in built from this package's decoder and encoder:
// it runs the server side of the handshake, then hands every request to a handler.
type testServer struct {
	t      testing.TB
	ln     net.Listener
	secret []byte
	hello  HelloReply // limits and sync mode to announce; nonce and proof are filled in
	// forgeProof makes the server send a proof it cannot compute (it does not know the secret).
	forgeProof bool
	// helloError, when set, answers Hello with this error instead.
	helloError error
	// rejectAuth makes the server refuse every client proof.
	rejectAuth bool
	// silent makes the server accept and read but never answer.
	silent bool
	// handle runs for each request on the connection's goroutine; f.Body is owned.
	handle func(sc *serverConn, f Frame)

	mu    sync.Mutex
	conns []*serverConn
	wg    sync.WaitGroup
}

// serverConn is one accepted connection.
type serverConn struct {
	net.Conn
	mu sync.Mutex // serialises replies from several goroutines
	w  Writer
}

// reply writes one reply frame.
func (sc *serverConn) reply(id uint64, m Message) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	sc.w.Append(id, m)
	_, _ = sc.w.WriteTo(sc.Conn)
}

// replyAll writes several replies with one write.
func (sc *serverConn) replyAll(ids []uint64, ms []Message) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	for i := range ids {
		sc.w.Append(ids[i], ms[i])
	}
	_, _ = sc.w.WriteTo(sc.Conn)
}

func newTestServer(t testing.TB, secret []byte, opts ...func(*testServer)) *testServer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := &testServer{
		t: t, ln: ln, secret: secret,
		hello:  HelloReply{Version: Version, SyncMode: SyncAlways, MaxBody: 1 << 20, MaxInflight: 256, LeaseMillis: 2000},
		handle: echo,
	}
	for _, o := range opts {
		o(s)
	}
	s.wg.Add(1)
	go s.accept()
	t.Cleanup(s.close)
	return s
}

func (s *testServer) addr() string { return s.ln.Addr().String() }

// conn0 returns the first connection the server accepted (the test knows there is one).
func (s *testServer) conn0() *serverConn {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.conns[0]
}

func (s *testServer) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		sc := &serverConn{Conn: c}
		s.mu.Lock()
		s.conns = append(s.conns, sc)
		s.mu.Unlock()
		s.wg.Add(1)
		go s.serve(sc)
	}
}

func (s *testServer) close() {
	_ = s.ln.Close()
	s.mu.Lock()
	for _, c := range s.conns {
		_ = c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// serve runs the handshake, then the request loop.
func (s *testServer) serve(sc *serverConn) {
	defer s.wg.Done()
	defer sc.Close()
	const bodyMax = 1 << 20
	br := NewFrameReader(sc, bodyMax)
	next := func(want Type) (Frame, bool) {
		f, n, err := ReadFrame(br, bodyMax)
		if err != nil {
			return Frame{}, false
		}
		f.Body = bytes.Clone(f.Body)
		_, _ = br.Discard(n)
		return f, want == 0 || f.Type == want
	}
	if s.silent {
		_, _ = io.Copy(io.Discard, sc)
		return
	}
	f, ok := next(TypeHello)
	if !ok {
		return
	}
	var hello Hello
	if hello.Parse(f.Body) != nil {
		return
	}
	if s.helloError != nil {
		sc.reply(f.ID, NewErrorReply(s.helloError))
		return
	}
	hr := s.hello
	hr.Nonce = NewNonce()
	transcript := Transcript(&hello, &hr)
	sc.reply(f.ID, &hr)
	if f, ok = next(TypeAuth); !ok {
		return
	}
	var auth Auth
	if auth.Parse(f.Body) != nil {
		return
	}
	key, err := ParseSecret(s.secret)
	if err == nil {
		err = CheckClientProof(key, hr.Nonce, hello.Nonce, transcript, auth.Proof)
	}
	if s.forgeProof { // it takes any proof, and cannot compute its own
		err, key = nil, []byte("a guess that is not the key")
	}
	if s.rejectAuth {
		err = ErrAuthFailed
	}
	if err != nil {
		sc.reply(f.ID, NewErrorReply(err))
		return
	}
	sc.reply(f.ID, &AuthOK{Proof: ServerProof(key, hello.Nonce, hr.Nonce, transcript)})
	for {
		f, ok := next(0)
		if !ok {
			return
		}
		s.handle(sc, f)
	}
}

// echo answers every request at once with a reply derived from it.
func echo(sc *serverConn, f Frame) {
	sc.reply(f.ID, answer(f))
}

// answer derives a reply from a request: callers check that the reply is theirs.
func answer(f Frame) Message {
	m := NewMessage(f.Type)
	if err := m.Parse(f.Body); err != nil {
		return NewErrorReply(err)
	}
	switch m := m.(type) {
	case *Ping:
		return &Pong{}
	case *Acquire:
		return &Grant{Table: m.Table, Owner: m.Owner, Epoch: m.Epoch + 1, LastSeq: m.Owner * 2}
	case *OpenTable:
		if m.Name == "missing" {
			return NewErrorReply(fmt.Errorf("storenode: open table %q: %w", m.Name, ErrTableNotFound))
		}
		return &TableInfo{Table: 1, RowBytes: 64, NextID: 640, Name: m.Name}
	case *Commit:
		return &CommitAck{LSN: m.Seq * 10, Seq: m.Seq}
	case *ReadPages:
		var reply Segments
		for _, w := range m.Wants {
			n := popcount(w.Want)
			reply.Segments = append(reply.Segments, base.Segment{Table: w.Table, RowBytes: 64, Page: w.Page, Data: w.Want, Rows: rows(n, 64, byte(w.Page))})
		}
		return &reply
	}
	return NewErrorReply(ErrUnsupported)
}

func popcount(x uint64) (n int) {
	for ; x != 0; x &= x - 1 {
		n++
	}
	return n
}

// dialTest dials s with the right secret and closes the client at the end of the test.
func dialTest(t testing.TB, s *testServer, mod ...func(*ClientConfig)) *Client {
	cfg := ClientConfig{Addr: s.addr(), Secret: s.secret, OwnerID: 7, Name: "test-client", DialTimeout: 5 * time.Second}
	for _, m := range mod {
		m(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// testCtx is the bound of one test's calls.
func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// gateConn wraps a client's net.Conn: it records every Write and can hold writes at a gate.
type gateConn struct {
	net.Conn
	entered chan []byte // each Write's bytes, as it starts

	mu   sync.Mutex
	gate chan struct{} // when not nil, a Write waits until it is closed
}

func (g *gateConn) Write(p []byte) (int, error) {
	g.mu.Lock()
	gate := g.gate
	g.mu.Unlock()
	g.entered <- bytes.Clone(p)
	if gate != nil {
		<-gate
	}
	return g.Conn.Write(p)
}

func (g *gateConn) hold() chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.gate = make(chan struct{})
	return g.gate
}

// withGate makes the client dial through a gateConn, returned through *out.
func withGate(out **gateConn) func(*ClientConfig) {
	return func(cfg *ClientConfig) {
		cfg.dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			*out = &gateConn{Conn: c, entered: make(chan []byte, 4096)}
			return *out, nil
		}
	}
}

// framesIn decodes the frames in one write.
func framesIn(t testing.TB, b []byte) []Frame {
	var fs []Frame
	for len(b) > 0 {
		f, n, err := Decode(b, MaxBodyLimit)
		require.NoError(t, err)
		fs = append(fs, f)
		b = b[n:]
	}
	return fs
}

// withTLS wraps the server's listener in TLS.
func withTLS(cfg *tls.Config) func(*testServer) {
	return func(s *testServer) { s.ln = tls.NewListener(s.ln, cfg) }
}
