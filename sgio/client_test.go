package sgio

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/corrupt"
	"github.com/weftdb/weft/internal/testkit"
)

func TestClientHandshake(t *testing.T) {
	t.Run("right secret", func(t *testing.T) {
		s := newTestServer(t, testSecret)
		c := dialTest(t, s)
		require.Equal(t, SyncAlways, c.Hello().SyncMode)
		require.Equal(t, uint32(1<<20), c.Hello().MaxBody)
		require.Equal(t, 256, c.MaxInflight())
		var g Grant
		require.NoError(t, c.CallInto(testCtx(t), &Acquire{Table: 1, Owner: 7}, &g))
		require.Equal(t, Grant{Table: 1, Owner: 7, Epoch: 1, LastSeq: 14}, g)
		require.NoError(t, c.Err())
	})
	t.Run("no secret on either side", func(t *testing.T) {
		c := dialTest(t, newTestServer(t, nil))
		_, err := c.Call(testCtx(t), &Ping{})
		require.NoError(t, err)
	})
	dial := func(s *testServer, cfg ClientConfig) error {
		cfg.Addr = s.addr()
		c, err := Dial(testCtx(t), cfg)
		if err == nil {
			_ = c.Close()
		}
		return err
	}
	t.Run("wrong secret", func(t *testing.T) {
		err := dial(newTestServer(t, testSecret), ClientConfig{Secret: otherSecret})
		require.ErrorIs(t, err, ErrAuthFailed)
		require.ErrorContains(t, err, "client proof mismatch", "the client proves first: the server refuses it")
	})
	t.Run("client without the server's secret", func(t *testing.T) {
		require.ErrorIs(t, dial(newTestServer(t, testSecret), ClientConfig{}), ErrAuthFailed)
	})
	t.Run("server that does not know the secret", func(t *testing.T) {
		s := newTestServer(t, testSecret, func(s *testServer) { s.forgeProof = true })
		err := dial(s, ClientConfig{Secret: testSecret})
		require.ErrorIs(t, err, ErrAuthFailed)
		require.ErrorContains(t, err, "server proof mismatch")
	})
	t.Run("server rejects the client's proof", func(t *testing.T) {
		s := newTestServer(t, nil, func(s *testServer) { s.rejectAuth = true })
		err := dial(s, ClientConfig{})
		require.ErrorIs(t, err, ErrAuthFailed)
		var re *RemoteError
		require.ErrorAs(t, err, &re)
	})
	t.Run("weak secrets are refused before dialing", func(t *testing.T) {
		for _, weak := range []string{"topsecret-123", "s", "0011223344556677", strings.Repeat("ab", 16), "not base64 or hex!"} {
			err := dial(newTestServer(t, nil), ClientConfig{Secret: []byte(weak)})
			require.ErrorIs(t, err, ErrWeakSecret, "secret %q", weak)
		}
	})
	t.Run("server busy", func(t *testing.T) {
		s := newTestServer(t, nil, func(s *testServer) { s.helloError = ErrBusy })
		require.ErrorIs(t, dial(s, ClientConfig{}), ErrBusy)
	})
	t.Run("deadline", func(t *testing.T) {
		s := newTestServer(t, nil, func(s *testServer) { s.silent = true })
		start := time.Now()
		err := dial(s, ClientConfig{DialTimeout: 100 * time.Millisecond})
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.Less(t, time.Since(start), 5*time.Second)
	})
	t.Run("cancel", func(t *testing.T) {
		s := newTestServer(t, nil, func(s *testServer) { s.silent = true })
		ctx, cancel := context.WithCancel(context.Background())
		dialed := make(chan *gateConn, 1)
		cfg := ClientConfig{Addr: s.addr()}
		cfg.dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			g := &gateConn{Conn: c, entered: make(chan []byte, 16)}
			dialed <- g
			return g, nil
		}
		go func() {
			<-(<-dialed).entered // Hello is on its way: cancel while the client waits for the reply
			cancel()
		}()
		_, err := Dial(ctx, cfg)
		require.ErrorIs(t, err, context.Canceled)
	})
	t.Run("bad config", func(t *testing.T) {
		s := newTestServer(t, nil)
		require.ErrorIs(t, dial(s, ClientConfig{Name: "no spaces"}), ErrBadName)
		require.ErrorIs(t, dial(s, ClientConfig{MaxBody: MaxBodyLimit + 1}), ErrFrameTooLarge)
	})
	t.Run("nobody listening", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		addr := ln.Addr().String()
		require.NoError(t, ln.Close())
		_, err = Dial(testCtx(t), ClientConfig{Addr: addr})
		require.Error(t, err)
	})
}

// testSecret and otherSecret are valid secrets (hex of 16 random bytes, base64 of 16).
var (
	testSecret  = []byte("8f1c2be04d6a39e7a5b2c47d10fe6e93")
	otherSecret = []byte("q2Zb0Xv1Jt6w+kLmN3s8Yg==")
)

func TestClientTLS(t *testing.T) {
	serverCfg, clientCfg := testkit.TLSConfigs(t)
	s := newTestServer(t, testSecret, withTLS(serverCfg))
	c := dialTest(t, s, func(cfg *ClientConfig) { cfg.TLS = clientCfg })
	var g Grant
	require.NoError(t, c.CallInto(testCtx(t), &Acquire{Table: 2, Owner: 3}, &g))
	require.Equal(t, uint64(3), g.Owner)

	// A client that does not trust the certificate fails in the TLS handshake.
	_, err := Dial(testCtx(t), ClientConfig{Addr: s.addr(), Secret: testSecret, TLS: &tls.Config{MinVersion: tls.VersionTLS13}})
	require.Error(t, err)
	require.ErrorContains(t, err, "tls")
}

// Many goroutines pipeline calls on one connection; every caller gets its own reply, and the
// sender packs many requests into each write.
func TestClientPipelining(t *testing.T) {
	s := newTestServer(t, nil)
	c := dialTest(t, s)
	goroutines, calls := 64, 200
	if testing.Short() {
		goroutines, calls = 16, 50
	}
	ctx := testCtx(t)
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := range goroutines {
		wg.Go(func() {
			for i := range calls {
				owner := uint64(g*calls + i)
				var grant Grant
				if err := c.CallInto(ctx, &Acquire{Table: uint32(g), Owner: owner, Epoch: uint64(i)}, &grant); err != nil {
					errs <- err
					return
				}
				if grant != (Grant{Table: uint32(g), Owner: owner, Epoch: uint64(i) + 1, LastSeq: owner * 2}) {
					errs <- errors.New("reply for another request")
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	st := c.Stats()
	require.Equal(t, uint64(goroutines*calls), st.Requests)
	require.Less(t, st.Writes, st.Requests, "requests share writes")
	t.Logf("%d requests in %d writes: %.1f requests per writev", st.Requests, st.Writes, float64(st.Requests)/float64(st.Writes))
	require.Equal(t, c.MaxInflight(), len(c.free), "every slot is free again")
}

// heldSender dials a test server through a gateConn, lets Hello and Auth through, holds the
// connection's writes (release lets them go) and sends a ping, whose result goes to
// pingDone; it returns once the sender is held in the write of that ping, first its bytes.
func heldSender(t *testing.T, ctx context.Context) (c *Client, gate *gateConn, release chan struct{}, pingDone chan error, first []byte) {
	t.Helper()
	s := newTestServer(t, nil)
	c = dialTest(t, s, withGate(&gate))
	<-gate.entered // Hello
	<-gate.entered // Auth
	release = gate.hold()
	pingDone = make(chan error, 1)
	goPing(ctx, c, pingDone)
	return c, gate, release, pingDone, <-gate.entered
}

// Deterministic batching: while the sender is held in a write, requests queue up; the next
// write carries all of them, as one Write on the connection.
func TestClientBatchesQueuedRequestsIntoOneWrite(t *testing.T) {
	ctx := testCtx(t)
	c, gate, release, pingDone, first := heldSender(t, ctx) // the sender is now held in the write of first

	const queued = 50
	require.Len(t, framesIn(t, first), 1)
	idx := make([]uint32, queued)
	for i := range queued {
		var err error
		idx[i], err = c.start(ctx, &Acquire{Owner: uint64(i)}, nil, false)
		require.NoError(t, err)
	}
	close(release)
	second := <-gate.entered
	frames := framesIn(t, second)
	require.Len(t, frames, queued, "one write for every queued request")
	for i, f := range frames {
		require.Equal(t, TypeAcquire, f.Type)
		var a Acquire
		require.NoError(t, a.Parse(f.Body))
		require.Equal(t, uint64(i), a.Owner, "in submission order")
	}
	for i := range queued {
		f, err := c.wait(ctx, idx[i], TypeAcquire)
		require.NoError(t, err)
		var g Grant
		require.NoError(t, g.Parse(f.Body))
		require.Equal(t, uint64(i), g.Owner)
	}
	require.NoError(t, <-pingDone)
	require.Equal(t, ClientStats{Requests: queued + 1, Writes: 2}, c.Stats())
}

// holdServer records requests and answers only when the test says so.
// goPing calls a Ping through c under ctx on a goroutine of its own; its error goes to done.
func goPing(ctx context.Context, c *Client, done chan<- error) {
	go func() {
		_, err := c.Call(ctx, &Ping{})
		done <- err
	}()
}

func holdServer(t *testing.T, got chan<- Frame) *testServer {
	return newTestServer(t, nil, func(s *testServer) {
		s.handle = func(sc *serverConn, f Frame) { got <- f }
	})
}

// The server answers a batch of requests in reverse order; each caller gets its own reply.
func TestClientRepliesOutOfOrder(t *testing.T) {
	const n = 32
	var mu sync.Mutex
	var held []Frame
	s := newTestServer(t, nil, func(s *testServer) {
		s.handle = func(sc *serverConn, f Frame) {
			mu.Lock()
			defer mu.Unlock()
			held = append(held, f)
			if len(held) < n {
				return
			}
			var ids []uint64
			var ms []Message
			for i := len(held) - 1; i >= 0; i-- {
				ids = append(ids, held[i].ID)
				ms = append(ms, answer(held[i]))
			}
			held = held[:0]
			sc.replyAll(ids, ms)
		}
	})
	c := dialTest(t, s)
	ctx := testCtx(t)
	owners := make(chan uint64, n)
	errs := make(chan error, n)
	for i := range n {
		go func() {
			var g Grant
			err := c.CallInto(ctx, &Acquire{Owner: uint64(i)}, &g)
			errs <- err
			if err == nil && g.Owner != uint64(i) {
				owners <- g.Owner
			}
		}()
	}
	for range n {
		require.NoError(t, <-errs)
	}
	require.Empty(t, owners, "replies matched to the wrong callers")
}

func TestClientErrorReply(t *testing.T) {
	c := dialTest(t, newTestServer(t, nil))
	ctx := testCtx(t)
	var ti TableInfo
	err := c.CallInto(ctx, &OpenTable{Name: "missing"}, &ti)
	require.ErrorIs(t, err, ErrTableNotFound)
	require.EqualError(t, err, `storenode: open table "missing": sgio: table not found`)
	// An error reply is an answer, not a broken connection.
	require.NoError(t, c.CallInto(ctx, &OpenTable{Name: "players"}, &ti))
	require.Equal(t, "players", ti.Name)
	_, err = c.Call(ctx, &Stats{})
	require.ErrorIs(t, err, ErrUnsupported)
	require.NoError(t, c.Err())
}

func TestClientRejectsBadRequestsLocally(t *testing.T) {
	c := dialTest(t, newTestServer(t, nil))
	ctx := testCtx(t)
	_, err := c.Call(ctx, &OpenTable{Name: "bad name"})
	require.ErrorIs(t, err, ErrBadName)
	big := &Commit{Segments: []base.Segment{{Table: 1, RowBytes: 4096, Data: ^uint64(0), Rows: make([]byte, 64*4096)}}}
	for range 4 {
		big.Segments = append(big.Segments, big.Segments[0])
	}
	_, err = c.Call(ctx, big) // 1.25 MiB, the server takes 1 MiB
	require.ErrorIs(t, err, ErrFrameTooLarge)
	require.Panics(t, func() { _, _ = c.Call(ctx, &Pong{}) }, "a reply is not a request")
	require.Equal(t, ClientStats{}, c.Stats(), "nothing was sent")
}

// The server closes the connection with requests in flight: every waiter, blocking or async,
// fails with ErrConnClosed, and with ErrUnknownOutcome since its request was sent.
func TestClientServerClosesMidFlight(t *testing.T) {
	got := make(chan Frame, 64)
	s := holdServer(t, got)
	c := dialTest(t, s)
	ctx := testCtx(t)
	const calls, sends = 8, 8
	errs := make(chan error, calls+sends)
	var wg sync.WaitGroup
	for range calls {
		wg.Go(func() {
			_, err := c.Call(ctx, &Ping{})
			errs <- err
		})
	}
	for range sends {
		require.NoError(t, c.Send(ctx, &Ping{}, func(f Frame, err error) {
			if f.Type != 0 {
				err = errors.New("a frame with a failure")
			}
			errs <- err
		}))
	}
	for range calls + sends {
		<-got // the server has every request
	}
	s.mu.Lock()
	require.NoError(t, s.conns[0].Close())
	s.mu.Unlock()
	wg.Wait()
	for range calls + sends {
		err := <-errs
		require.ErrorIs(t, err, ErrConnClosed)
		require.ErrorIs(t, err, ErrUnknownOutcome)
	}
	<-c.Done()
	require.ErrorIs(t, c.Err(), ErrConnClosed)
	_, err := c.Call(ctx, &Ping{})
	require.ErrorIs(t, err, ErrConnClosed)
	require.NotErrorIs(t, err, ErrUnknownOutcome, "never sent")
	require.ErrorIs(t, c.Send(ctx, &Ping{}, func(Frame, error) { t.Error("callback of a refused Send") }), ErrConnClosed)
	require.NoError(t, c.Close())
	require.NoError(t, c.Close(), "idempotent")
}

func TestClientClose(t *testing.T) {
	got := make(chan Frame, 8)
	c := dialTest(t, holdServer(t, got))
	ctx := testCtx(t)
	done := make(chan error, 1)
	goPing(ctx, c, done)
	<-got
	require.NoError(t, c.Close())
	err := <-done
	require.ErrorIs(t, err, ErrConnClosed)
	require.ErrorIs(t, err, net.ErrClosed)
	require.ErrorIs(t, err, ErrUnknownOutcome)
	require.NoError(t, c.Close())
}

// A reply for a request that is not in flight is a protocol violation: the connection closes.
func TestClientProtocolViolation(t *testing.T) {
	for name, bad := range map[string]func(sc *serverConn, f Frame){
		"unknown id": func(sc *serverConn, f Frame) { sc.reply(f.ID+1<<slotBits, &Pong{}) },
		"wrong type": func(sc *serverConn, f Frame) { sc.reply(f.ID, &CommitAck{}) },
		"bad error":  func(sc *serverConn, f Frame) { sc.reply(f.ID, &ErrorReply{Code: 0}) },
		"bad frame": func(sc *serverConn, f Frame) {
			b := AppendFrame(nil, f.ID, &Pong{})
			b[0] = 'X'
			_, _ = sc.Write(b)
		},
	} {
		t.Run(name, func(t *testing.T) {
			s := newTestServer(t, nil, func(s *testServer) { s.handle = bad })
			c := dialTest(t, s)
			_, err := c.Call(testCtx(t), &Ping{})
			require.ErrorIs(t, err, ErrConnClosed)
			require.ErrorIs(t, c.Err(), corrupt.ErrCorruption)
		})
	}
}

func TestClientCancelBeforeSend(t *testing.T) {
	got := make(chan Frame, 8)
	s := holdServer(t, got)
	var gate *gateConn
	c := dialTest(t, s, withGate(&gate))
	<-gate.entered
	<-gate.entered

	// A context that already ended sends nothing.
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := c.Call(ended, &Ping{})
	require.ErrorIs(t, err, context.Canceled)
	require.NotErrorIs(t, err, ErrUnknownOutcome)

	// Hold the sender in the write of A; queue B; cancel B: withdrawn, never sent.
	release := gate.hold()
	ctxA, cancelA := context.WithCancel(testCtx(t))
	doneA := make(chan error, 1)
	go func() {
		_, err := c.Call(ctxA, &Acquire{Owner: 1})
		doneA <- err
	}()
	<-gate.entered
	ctxB, cancelB := context.WithCancel(testCtx(t))
	idxB, err := c.start(ctxB, &Acquire{Owner: 2}, nil, false)
	require.NoError(t, err)
	cancelB()
	_, err = c.wait(ctxB, idxB, TypeAcquire)
	require.ErrorIs(t, err, context.Canceled)
	require.NotErrorIs(t, err, ErrUnknownOutcome)

	// A's context ends while its write is in progress: Call waits for the write, then reports
	// the outcome unknown.
	cancelA()
	close(release)
	err = <-doneA
	require.ErrorIs(t, err, ErrUnknownOutcome)
	require.ErrorIs(t, err, context.Canceled)

	// The server saw A only; a later request goes through.
	f := <-got
	var a Acquire
	require.NoError(t, a.Parse(f.Body))
	require.Equal(t, uint64(1), a.Owner)
	sc := s.conn0()
	sc.reply(f.ID, answer(f)) // the late reply to A is dropped
	pingDone := make(chan error, 1)
	goPing(testCtx(t), c, pingDone)
	f = <-got
	require.Equal(t, TypePing, f.Type, "B never reached the server")
	sc.reply(f.ID, answer(f))
	require.NoError(t, <-pingDone)
	require.Equal(t, c.MaxInflight(), len(c.free), "A's slot came back with its late reply")
}

func TestClientCancelAfterSend(t *testing.T) {
	got := make(chan Frame, 8)
	s := holdServer(t, got)
	c := dialTest(t, s)
	ctx, cancel := context.WithCancel(testCtx(t))
	done := make(chan error, 1)
	go func() {
		_, err := c.Call(ctx, &Commit{Owner: 1, Seq: 5})
		done <- err
	}()
	f := <-got // on the server: the outcome is now unknown to the client
	cancel()
	err := <-done
	require.ErrorIs(t, err, ErrUnknownOutcome)
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, c.MaxInflight()-1, len(c.free), "the slot is held until the reply")

	sc := s.conn0()
	sc.reply(f.ID, answer(f))
	pong := make(chan error, 1)
	goPing(testCtx(t), c, pong)
	sc.reply((<-got).ID, &Pong{})
	require.NoError(t, <-pong)
	require.Equal(t, c.MaxInflight(), len(c.free))
	require.NoError(t, c.Err())
}

// fullWindow dials a holding server (holdServer: its frames go to got, unanswered) with a
// window of two requests and fills the window with two pings, whose results go to results;
// it returns got, the server, the client and the two frames held.
func fullWindow(t *testing.T, ctx context.Context, results chan<- error) (got chan Frame, s *testServer, c *Client, f1, f2 Frame) {
	t.Helper()
	got = make(chan Frame, 8)
	s = holdServer(t, got)
	c = dialTest(t, s, func(cfg *ClientConfig) { cfg.MaxInflight = 2 })
	require.Equal(t, 2, c.MaxInflight())
	for range 2 {
		goPing(ctx, c, results)
	}
	f1, f2 = <-got, <-got
	return got, s, c, f1, f2
}

func TestClientInflightBound(t *testing.T) {
	ctx := testCtx(t)
	results := make(chan error, 3)
	got, s, c, f1, f2 := fullWindow(t, ctx, results)

	// A third request waits for a slot until its context ends: ErrBusy.
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	_, err := c.Call(short, &Ping{})
	require.ErrorIs(t, err, ErrBusy)
	require.ErrorIs(t, err, context.DeadlineExceeded)

	// With a longer context it proceeds as soon as a reply frees a slot.
	goPing(ctx, c, results)
	sc := s.conn0()
	sc.reply(f1.ID, &Pong{})
	f3 := <-got
	sc.reply(f2.ID, &Pong{})
	sc.reply(f3.ID, &Pong{})
	for range 3 {
		require.NoError(t, <-results)
	}
}

// Async Send: the callback runs on the receiver goroutine with a frame valid during the call.
func TestClientSend(t *testing.T) {
	c := dialTest(t, newTestServer(t, nil))
	ctx := testCtx(t)
	n := 500
	if testing.Short() {
		n = 100
	}
	var wg sync.WaitGroup
	var bad atomic.Int64
	for i := range n {
		wg.Add(1)
		rp := &ReadPages{Wants: []base.PageWant{{Table: 1, Page: uint64(i), Want: 0b1011}}}
		require.NoError(t, c.Send(ctx, rp, func(f Frame, err error) {
			defer wg.Done()
			it, verr := ViewSegments(f.Body)
			if err != nil || verr != nil || f.Type != TypeSegments {
				bad.Add(1)
				return
			}
			var s base.Segment
			it.Next(&s)
			if s.Page != uint64(i) || s.Data != 0b1011 || len(s.Rows) != 3*64 || s.Rows[0] != byte(i) {
				bad.Add(1)
			}
		}))
	}
	wg.Wait()
	require.Zero(t, bad.Load())

	// An error reply reaches the callback with its error and the Error frame.
	errc := make(chan error, 1)
	require.NoError(t, c.Send(ctx, &OpenTable{Name: "missing"}, func(f Frame, err error) {
		if f.Type != TypeError {
			err = errors.New("not the Error frame")
		}
		errc <- err
	}))
	require.ErrorIs(t, <-errc, ErrTableNotFound)
}
