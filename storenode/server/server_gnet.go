package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/panjf2000/gnet/v2"
	errorx "github.com/panjf2000/gnet/v2/pkg/errors"

	"github.com/weftdb/weft/sgio"
)

// The gnet transport: event loops over epoll, one per core (Config.EventLoops). The
// server accepts connections itself (server_accept.go) and hands each to an event loop with
// Engine.Register; gnet calls OnTraffic on a connection's event loop with the bytes read; the
// session consumes the whole frames (session.inbound) and gnet keeps the rest. Replies
// produced on the event loop are written with Conn.Writev at the end of its turn; replies of
// goroutines with Conn.AsyncWritev, whose callback runs on the event loop once the bytes are
// written or copied into gnet's outbound buffer. Every writev carries at most iovMax slices
// (Linux refuses more with EINVAL, and gnet then closes the connection).
//
// A write of more than writeSliceBytes is sliced: gnet copies what the socket does not take
// into its outbound buffer, on the loop, so one writev of a 16 MiB reply to a slow reader
// cost the loop's other connections that copy (issue 22, defect 13: pings delayed 80-120 ms).
// The transport hands such a write to gnet writeSliceBytes per wake-up of the loop: the next
// slice comes on a later wake-up (a timer's Execute, a new pass of the poller, so the other
// connections' events are served between), once gnet's outbound buffer holds less than
// writeLowWater (else the recheck timer looks again, tick). The session stays busy until the
// last slice is handed (its done then runs, on the loop), as for an async write.
//
// Invariants of a sliced write:
//   - At most one (the session's busy flag); rest, restOff and restLeft are what is left of
//     it, restDone ends it; restDone is nil when there is none.
//   - The bytes of rest stay valid until restDone ran (they are the session's sending).
//   - restDone runs exactly once: after the last slice, with the error of a failed writev, with
//     net.ErrClosed once the connection closed (OnClose), or with the stall error.

// iovMax is the kernel's limit on the slices of one writev (IOV_MAX, UIO_MAXIOV on Linux).
const iovMax = 1024

// gnetHandler is the gnet event handler: it feeds each connection's inbound bytes to its
// session.
type gnetHandler struct {
	gnet.BuiltinEventEngine
	srv    *Server
	booted chan gnet.Engine
	ready  chan struct{} // closed when the readiness probe reached OnOpen
	once   sync.Once
}

// bootGnet starts the event loops (Start then opens the engine and calls serveGnet). gnet
// itself listens only on a unix socket in a private (0700) temporary directory, which is
// removed as soon as a probe connection proved the event loops run: gnet.Run needs a
// listener, and its return is the signal that the engine stopped, but nobody is to connect
// to it (a connection without a session is closed at OnOpen all the same). The TCP address
// is the server's own listener, served by acceptLoop. On failure nothing is left running.
func (s *Server) bootGnet() error {
	dir, err := os.MkdirTemp("", "storenode-gnet-")
	if err != nil {
		return fmt.Errorf("storenode: gnet's private socket: %w", err)
	}
	h := &gnetHandler{srv: s, booted: make(chan gnet.Engine, 1), ready: make(chan struct{})}
	sock := filepath.Join(dir, "gnet.sock")
	s.runDone = make(chan error, 1)
	s.gnetDone = make(chan struct{})
	opts := []gnet.Option{
		gnet.WithMulticore(true),
		gnet.WithNumEventLoop(s.cfg.EventLoops),
		gnet.WithLoadBalancing(gnet.LeastConnections),
		gnet.WithLogger(gnetLogger{s.log}),
	}
	go func() {
		err := gnet.Run(h, "unix://"+sock, opts...)
		_ = os.RemoveAll(dir)
		s.runDone <- err
	}()
	select {
	case eng := <-h.booted:
		s.gnetEng = eng
	case err := <-s.runDone:
		if err == nil {
			err = errors.New("gnet stopped at boot")
		}
		return fmt.Errorf("storenode: start gnet: %w", err)
	}
	// OnBoot runs before the event loops exist (Register would fail): a connection to the
	// private socket reaching OnOpen proves they run.
	probe, err := net.Dial("unix", sock)
	if err == nil {
		select {
		case <-h.ready:
		case err = <-s.runDone:
			if err == nil {
				err = errors.New("gnet stopped at boot")
			}
		}
		_ = probe.Close()
	}
	// The socket has served its purpose: unlinked, nobody can reach it (the listening socket
	// lives on without a name), and a kill -9 leaves nothing behind in TMPDIR.
	_ = os.RemoveAll(dir)
	if err != nil {
		s.stopGnetEngine()
		return fmt.Errorf("storenode: start gnet: %w", err)
	}
	return nil
}

// serveGnet starts the accept loop on ln, which hands connections to the booted event
// loops, and the watcher of gnet.Run.
func (s *Server) serveGnet(ln net.Listener) {
	s.ln, s.addr = ln, ln.Addr()
	s.stopAcc, s.accDone = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(s.accDone)
		s.acceptLoop(ln, s.stopAcc, s.registerGnet)
	}()
	go s.watchGnet()
}

// watchGnet waits for gnet.Run to return; when it returns before Shutdown asked it to, the
// engine stopped on its own, and the server is failed (Healthy, Failed).
func (s *Server) watchGnet() {
	err := <-s.runDone
	if !s.gnetStopping.Load() {
		if err == nil {
			err = errors.New("gnet.Run returned")
		}
		s.log.Error("storenode: the network engine stopped; no longer serving", "err", err)
		s.fatal.set(fmt.Errorf("%w: %w", ErrTransportStopped, err))
	}
	close(s.gnetDone)
}

// registerGnet admits an accepted connection and hands it to an event loop; the session
// travels in the connection's context to OnOpen. Only the accept loop calls it.
func (s *Server) registerGnet(c net.Conn) {
	sess := s.newSession(nil, c.RemoteAddr().String())
	sess.refusal, sess.linger = s.admit(sess)
	ctx := gnet.NewNetConnContext(gnet.NewContext(context.Background(), sess), c)
	res, err := s.gnetEng.Register(ctx) // dups the socket and closes c
	if err == nil {
		if r, ok := <-res; !ok {
			err = errors.New("gnet did not register the connection")
		} else {
			err = r.Err
		}
	} else {
		_ = c.Close()
	}
	if err == nil {
		return
	}
	s.limitedLog("storenode: could not hand a connection to an event loop", "remote", sess.remote, "err", err)
	sess.closed(err)
	if errors.Is(err, errorx.ErrEngineInShutdown) && !s.gnetStopping.Load() {
		s.fatal.set(fmt.Errorf("%w: %w", ErrTransportStopped, err))
	}
}

// stopGnet stops accepting, then stops the gnet engine, which closes every connection
// (OnClose runs for each), and waits for gnet.Run to return. Engine.Stop polls every 500ms
// for the end, so it is given an ended context (it still starts the shutdown) and the end is
// awaited on Run instead.
func (s *Server) stopGnet() {
	s.gnetStopping.Store(true)
	close(s.stopAcc)
	_ = s.ln.Close()
	<-s.accDone
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = s.gnetEng.Stop(ctx)
	<-s.gnetDone
}

// stopGnetEngine stops an engine that failed to start up (no accept loop, no watcher yet).
func (s *Server) stopGnetEngine() {
	s.gnetStopping.Store(true)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = s.gnetEng.Stop(ctx)
	select {
	case <-s.runDone:
	case <-time.After(10 * time.Second): // Run has already returned and its result was taken
	}
}

func (h *gnetHandler) OnBoot(eng gnet.Engine) gnet.Action {
	h.booted <- eng
	return gnet.None
}

func (h *gnetHandler) OnOpen(c gnet.Conn) ([]byte, gnet.Action) {
	sess, _ := c.Context().(*session)
	if sess == nil { // the readiness probe on gnet's private socket
		h.once.Do(func() { close(h.ready) })
		return nil, gnet.Close
	}
	if !sess.attach(newGnetTransport(c, sess)) {
		return nil, gnet.Close // evicted before it reached the loop
	}
	refusal, linger := sess.refusal, sess.linger
	if refusal == nil {
		sess.armAuthTimer()
		return nil, gnet.None
	}
	// Tell the client why, then close: at once when too many linger, else after its Hello
	// arrived (closing before reading it would reset the connection, and the client could
	// lose the reply) or at the auth deadline.
	out := sgio.AppendFrame(nil, 0, sgio.NewErrorReply(refusal))
	if !linger {
		return out, gnet.Close
	}
	sess.refuse()
	return out, gnet.None
}

func (h *gnetHandler) OnTraffic(c gnet.Conn) gnet.Action {
	sess, _ := c.Context().(*session)
	if sess == nil {
		return gnet.Close
	}
	if t, _ := sess.tr.(*gnetTransport); t != nil && t.overBudget() {
		return gnet.None // looked at again in outboundRecheck (t.recheck wakes the loop)
	}
	if need := sess.needBytes; need > 0 && c.InboundBuffered() < need {
		return gnet.None // the rest of a large frame: do not re-peek what is already buffered
	}
	// A session paused behind a write in progress is read all the same once gnet holds more
	// than stoppedInboundMaxBytes of its requests (gnet reads its socket anyway); its bound
	// then applies: more than outboundMaxBytes of replies untaken closes it.
	buffered := c.InboundBuffered()
	sess.readOn = buffered > stoppedInboundMaxBytes
	// At most inboundPeekMax (or the frame waited for) a turn: gnet copies what it peeks when
	// its buffer wraps, and a turn that stops early (turnReplyMaxBytes) would copy all of a
	// large backlog again each time. A turn that did not pause wakes the loop for the rest.
	peek := buffered
	if peek > inboundPeekMax {
		peek = min(max(inboundPeekMax, sess.needBytes), buffered)
	}
	buf, _ := c.Peek(peek)
	n, closeNow := sess.inbound(buf)
	if n > 0 {
		_, _ = c.Discard(n)
	}
	if closeNow {
		return gnet.Close
	}
	if peek < buffered && !sess.paused {
		if t, _ := sess.tr.(*gnetTransport); t != nil {
			t.wake()
		}
	}
	if t, _ := sess.tr.(*gnetTransport); t != nil && t.restDone != nil {
		if unsent, held := t.unsent(), sess.pendingBytes(); int64(unsent)+held > outboundMaxBytes {
			sess.closeWith(fmt.Sprintf("client does not read its replies: %d bytes unsent, %d more held", unsent, held), slog.LevelInfo)
		}
	}
	return gnet.None
}

func (h *gnetHandler) OnClose(c gnet.Conn, err error) gnet.Action {
	if sess, _ := c.Context().(*session); sess != nil {
		if t, _ := sess.tr.(*gnetTransport); t != nil {
			t.forget()
			sess.closed(err)
			t.abandon()
			return gnet.None
		}
		sess.closed(err)
	}
	return gnet.None
}

// gnetTransport is a session's gnet connection.
type gnetTransport struct {
	c    gnet.Conn
	sess *session
	// The async write in progress (at most one: the session's busy flag), set by writeAsync
	// under the session's lock and read by runAsync on the loop: Execute's queue orders the
	// two, and the next writeAsync comes only after done ran.
	bufs   [][]byte
	done   func(error)
	runner gnet.Runnable // gnet.RunnableFunc(t.runAsync), made once
	// The loop's own: its unsent bytes as last seen (gnet's outbound buffer and the rest of a
	// sliced write: counted in Server.outbound); the timer that looks at it again while it is not empty, since gnet
	// tells nobody when a client drains it (made at the first need; armed: it is set), and
	// whether the connection was stopped by the server-wide budget (the timer then wakes its
	// reads).
	queued  int64
	recheck *time.Timer
	armed   bool
	stopped bool
	every   time.Duration // the timer's interval: doubles up to outboundRecheckMax while the buffer stays the same
	ticker  gnet.Runnable // gnet.RunnableFunc(t.tick), made once
	// The sliced write in progress, the loop's own (see the invariants above): rest[0][restOff:]
	// and the rest of rest, restLeft bytes; iov is the scratch of one slice's writev; moved is
	// when it last moved (a slice handed, the outbound buffer shrank), for the stall bound
	// (Config.WriteTimeout); yield is the timer that continues it on a later wake-up.
	rest     [][]byte
	restOff  int
	restLeft int
	restDone func(error)
	iov      [][]byte
	moved    time.Time
	yield    *time.Timer
	cont     gnet.Runnable // gnet.RunnableFunc(t.continueWrite), made once
}

// inboundPeekMax bounds the inbound bytes one turn looks at (OnTraffic), unless a larger
// frame is waited for.
const inboundPeekMax = 1 << 20

// errWriteLater is writeLoop's report that it started a sliced write: the session's done
// (asyncWriteDone) runs on the loop once it is all handed to gnet.
var errWriteLater = errors.New("storenode: the write continues in slices")

func newGnetTransport(c gnet.Conn, sess *session) *gnetTransport {
	t := &gnetTransport{c: c, sess: sess}
	t.runner = gnet.RunnableFunc(t.runAsync)
	t.ticker = gnet.RunnableFunc(t.tick)
	t.cont = gnet.RunnableFunc(t.continueWrite)
	return t
}

// writeLoop writes on the event loop: synchronous, the bytes are written or copied into gnet's
// outbound buffer when it returns, at most iovMax slices per writev. A client that lets more
// than outboundMaxBytes pile up unread is cut off, checked before its bytes are queued: a
// write that finds the outbound buffer non-empty and would take it past the bound fails
// instead (an empty buffer always takes a write: it may go straight to the socket). A write
// of more than writeSliceBytes hands its first slice and reports errWriteLater: the rest
// follows on later wake-ups (continueWrite), and the session's asyncDoneFn ends it.
func (t *gnetTransport) writeLoop(bufs [][]byte) error {
	total := 0
	for _, b := range bufs {
		total += len(b)
	}
	if queued := t.c.OutboundBuffered(); queued > 0 && queued+total > outboundMaxBytes {
		return fmt.Errorf("storenode: client does not read its replies: %d bytes queued, %d more to send: %w",
			queued, total, sgio.ErrBusy)
	}
	if total > writeSliceBytes {
		t.rest, t.restOff, t.restLeft, t.moved = bufs, 0, total, time.Now()
		if err := t.writeSlice(); err != nil {
			t.endSliced()
			return err
		}
		t.restDone = t.sess.asyncDoneFn
		t.next()
		return errWriteLater
	}
	defer t.observe()
	var start time.Time
	h := t.sess.srv.cfg.writeHook
	if h != nil {
		start = time.Now()
	}
	for len(bufs) > 0 {
		n := min(len(bufs), iovMax)
		if _, err := t.c.Writev(bufs[:n]); err != nil {
			return err
		}
		bufs = bufs[n:]
	}
	if h != nil {
		h(t.sess.owner, total, 0, time.Since(start))
	}
	return nil
}

// writeSlice hands the next slice of the sliced write, at most writeSliceBytes and iovMax
// pieces, to gnet. On the loop; a failed writev has closed the connection (OnClose ran).
func (t *gnetTransport) writeSlice() error {
	iov := t.iov[:0]
	n := 0
	for i, b := range t.rest {
		if i == 0 {
			b = b[t.restOff:]
		}
		if n+len(b) > writeSliceBytes {
			b = b[:writeSliceBytes-n]
		}
		iov = append(iov, b)
		if n += len(b); n == writeSliceBytes || len(iov) == iovMax {
			break
		}
	}
	t.iov = iov[:0]
	var start time.Time
	h := t.sess.srv.cfg.writeHook
	if h != nil {
		start = time.Now()
	}
	_, err := t.c.Writev(iov)
	clear(iov) // drop the references to the rows
	if err != nil {
		return err
	}
	t.restLeft -= n
	t.moved = time.Now()
	for k := n; k > 0; {
		if l := len(t.rest[0]) - t.restOff; k < l {
			t.restOff += k
			break
		} else {
			k -= l
		}
		t.rest, t.restOff = t.rest[1:], 0
	}
	if t.restLeft == 0 {
		t.rest = nil
	}
	if h != nil {
		h(t.sess.owner, n, t.restLeft, time.Since(start))
	}
	return nil
}

// next schedules the sliced write's next slice: on a later wake-up at once when gnet's
// outbound buffer is below writeLowWater, else at the recheck timer's look (observe arms it:
// the buffer is not empty). On the loop.
func (t *gnetTransport) next() {
	t.observe()
	if t.c.OutboundBuffered() >= writeLowWater {
		return
	}
	if t.yield == nil {
		t.yield = time.AfterFunc(0, func() {
			// On the timer's goroutine: the slice is the loop's (Execute). An error means the
			// engine stopped, and OnClose has run or will.
			_ = t.c.EventLoop().Execute(context.Background(), t.cont)
		})
		return
	}
	t.yield.Reset(0)
}

// continueWrite hands the sliced write's next slice, if gnet's outbound buffer has room for
// it (else next is called again by the recheck timer), and ends the write once all is handed.
// On the loop; nothing once the connection closed (OnClose ended the write).
func (t *gnetTransport) continueWrite(context.Context) error {
	if t.restDone == nil || t.sess.isClosedNow() {
		return nil
	}
	if t.c.OutboundBuffered() >= writeLowWater {
		return nil // tick looks again
	}
	done := t.restDone
	t.restDone = nil // a failing writev closes the connection inside (OnClose): nothing to end there
	err := t.writeSlice()
	if err != nil || t.restLeft == 0 {
		t.endSliced()
		if err == nil {
			t.observe()
		}
		done(err)
		return nil
	}
	t.restDone = done
	t.next()
	return nil
}

// stalled ends a sliced write that moved for no Config.WriteTimeout (its client takes none of
// its bytes) with an error, which closes the connection: as a TLS write's deadline does.
func (t *gnetTransport) stalled() bool {
	if t.restDone == nil || time.Since(t.moved) <= t.sess.srv.cfg.WriteTimeout {
		return false
	}
	left := t.restLeft
	done := t.endSliced()
	done(fmt.Errorf("storenode: client does not read its replies: %d bytes queued, %d more to send, none taken for %v: %w",
		t.c.OutboundBuffered(), left, t.sess.srv.cfg.WriteTimeout, sgio.ErrBusy))
	return true
}

// abandon ends a sliced write whose connection closed; OnClose calls it after the session
// closed (so that done does not close the connection again).
func (t *gnetTransport) abandon() {
	if done := t.endSliced(); done != nil {
		done(net.ErrClosed)
	}
}

// endSliced forgets the sliced write and returns its done (nil when there was none).
func (t *gnetTransport) endSliced() func(error) {
	done := t.restDone
	t.rest, t.restOff, t.restLeft, t.restDone = nil, 0, 0, nil
	return done
}

// unsent reports the bytes of the connection's replies handed to the transport that its
// client has not taken: gnet's outbound buffer and the rest of a sliced write. On the loop.
func (t *gnetTransport) unsent() int { return t.c.OutboundBuffered() + t.restLeft }

// observe counts the connection's unsent bytes (unsent), as they are now, in the server's
// total, and while there are some arms the timer that looks again (tick): a client that drains it
// and sends nothing more must not keep its bytes in the total. On the loop.
func (t *gnetTransport) observe() {
	n := int64(t.unsent())
	if d := n - t.queued; d != 0 {
		t.queued = n
		if total := t.sess.srv.outbound.Add(d); d > 0 {
			for peak := t.sess.srv.outPeak.Load(); total > peak && !t.sess.srv.outPeak.CompareAndSwap(peak, total); {
				peak = t.sess.srv.outPeak.Load()
			}
		}
	}
	if n > 0 {
		t.arm()
	}
}

// arm sets the recheck timer unless it is set. On the loop.
func (t *gnetTransport) arm() {
	if t.armed {
		return
	}
	t.armed = true
	if t.every == 0 {
		t.every = outboundRecheck
	}
	if t.recheck == nil {
		t.recheck = time.AfterFunc(t.every, func() {
			// On the timer's goroutine: the look itself is the loop's (Execute). An error
			// means the engine stopped, and OnClose has run or will.
			_ = t.c.EventLoop().Execute(context.Background(), t.ticker)
		})
		return
	}
	t.recheck.Reset(t.every)
}

// tick is the recheck timer's look, on the loop: the outbound buffer is counted again (the
// timer is armed again while it is not empty), and a connection the budget stopped is woken
// for another turn (overBudget decides again). Nothing once the connection closed.
func (t *gnetTransport) tick(context.Context) error {
	t.armed = false
	if t.sess.isClosedNow() {
		return nil // OnClose ran (forget): the connection, maybe its fd, is gone
	}
	// A client that takes nothing is looked at less and less often (a stuck connection must
	// not cost the loop a wake every outboundRecheck forever); one that moves, at once again.
	if n := int64(t.unsent()); n > 0 && n == t.queued {
		t.every = min(2*t.every, outboundRecheckMax)
	} else {
		t.every = outboundRecheck
		t.moved = time.Now()
	}
	t.observe()
	if t.restDone != nil {
		if t.stalled() {
			return nil
		}
		_ = t.continueWrite(context.Background())
	}
	if t.stopped {
		t.stopped = false
		t.wake()
	}
	return nil
}

// overBudget reports, on the loop at the start of a turn, whether the connection is not to be
// read now: the replies waiting on all connections are over MaxOutboundBytesTotal and some of
// them are this connection's. Then the recheck timer wakes the loop for another look; nothing
// blocks the loop. A connection whose output has drained is always read: the bound cannot
// stop every connection, and the ones it stops resume as their clients read. So is one with
// more than stoppedInboundMaxBytes of requests buffered (gnet still reads a stopped socket).
func (t *gnetTransport) overBudget() bool {
	t.observe()
	srv := t.sess.srv
	if t.queued == 0 || srv.outbound.Load() <= srv.cfg.MaxOutboundBytesTotal {
		return false
	}
	if t.c.InboundBuffered() > stoppedInboundMaxBytes {
		// gnet reads the socket of a stopped connection all the same: a client that keeps
		// sending while it reads nothing would grow the inbound buffer without end. Read it:
		// its own bound (outboundMaxBytes) then applies, as if there were no budget.
		return false
	}
	srv.counters.outboundPauses.Add(1)
	t.stopped = true // observe armed the timer: t.queued > 0
	return true
}

// forget takes the connection's outbound bytes out of the server's total; OnClose calls it.
func (t *gnetTransport) forget() {
	t.sess.srv.outbound.Add(-t.queued)
	t.queued = 0
	if t.recheck != nil {
		t.recheck.Stop()
	}
	if t.yield != nil {
		t.yield.Stop()
	}
	t.armed, t.stopped = false, false
}

// writeAsync hands bufs to the event loop, which writes them as writeLoop does (the bound is
// checked there, before the bytes are queued); done runs there once they are written or
// copied. gnet's Execute allocates its own task closure and queue node (two objects per
// call; every gnet API that reaches the loop from another goroutine does: AsyncWritev, Wake,
// Execute); nothing else here allocates.
func (t *gnetTransport) writeAsync(bufs [][]byte, done func(error)) error {
	t.bufs, t.done = bufs, done
	err := t.c.EventLoop().Execute(context.Background(), t.runner)
	if err != nil {
		t.bufs, t.done = nil, nil
	}
	return err
}

// runAsync is the async write on the loop.
func (t *gnetTransport) runAsync(context.Context) error {
	bufs, done := t.bufs, t.done
	t.bufs, t.done = nil, nil
	if t.sess.isClosedNow() {
		done(net.ErrClosed) // OnClose ran: the connection (and maybe its fd) is gone
		return nil
	}
	if err := t.writeLoop(bufs); err != errWriteLater {
		done(err)
	} else {
		t.restDone = done // sliced: done runs once the last slice is handed
	}
	return nil
}

// wake asks the event loop for another OnTraffic turn on the bytes already buffered.
func (t *gnetTransport) wake() { _ = t.c.Wake(nil) }

// close closes the connection from any goroutine.
func (t *gnetTransport) close() { _ = t.c.Close() }

// gnetLogger routes gnet's own logs to slog at debug level (errors at error level).
type gnetLogger struct{ l *slog.Logger }

func (g gnetLogger) Debugf(format string, args ...any) {
	g.l.Debug("gnet: " + fmt.Sprintf(format, args...))
}
func (g gnetLogger) Infof(format string, args ...any) {
	g.l.Debug("gnet: " + fmt.Sprintf(format, args...))
}
func (g gnetLogger) Warnf(format string, args ...any) {
	g.l.Warn("gnet: " + fmt.Sprintf(format, args...))
}
func (g gnetLogger) Errorf(format string, args ...any) {
	g.l.Error("gnet: " + fmt.Sprintf(format, args...))
}
func (g gnetLogger) Fatalf(format string, args ...any) {
	g.l.Error("gnet: " + fmt.Sprintf(format, args...))
}
