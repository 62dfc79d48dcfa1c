package storenode

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"

	"github.com/panjf2000/gnet/v2"
	"golang.org/x/sys/unix"

	"github.com/weftdb/weft/sgio"
)

// The gnet transport: event loops over epoll, one per core (ServerConfig.EventLoops). gnet
// calls OnTraffic on a connection's event loop with the bytes read; the session consumes the
// whole frames (session.inbound) and gnet keeps the rest. Replies produced on the event loop
// are written with Conn.Writev at the end of its turn; replies of goroutines with
// Conn.AsyncWritev, whose callback runs on the event loop once the bytes are written or
// copied into gnet's outbound buffer.

// gnetHandler is the gnet event handler: it feeds each connection's inbound bytes to its
// session.
type gnetHandler struct {
	gnet.BuiltinEventEngine
	srv    *Server
	booted chan gnet.Engine
}

func (s *Server) startGnet() error {
	h := &gnetHandler{srv: s, booted: make(chan gnet.Engine, 1)}
	s.runDone = make(chan error, 1)
	proto := "tcp://" + s.cfg.Listen
	opts := []gnet.Option{
		gnet.WithMulticore(true),
		gnet.WithNumEventLoop(s.cfg.EventLoops),
		gnet.WithTCPNoDelay(gnet.TCPNoDelay),
		gnet.WithReuseAddr(true),
		gnet.WithLogger(gnetLogger{s.log}),
	}
	go func() { s.runDone <- gnet.Run(h, proto, opts...) }()
	select {
	case eng := <-h.booted:
		s.gnetEng = eng
	case err := <-s.runDone:
		if err == nil {
			err = errors.New("gnet stopped at boot")
		}
		return fmt.Errorf("storenode: listen on %s: %w", s.cfg.Listen, err)
	}
	addr, err := gnetAddr(s.gnetEng)
	if err != nil {
		s.stopGnet()
		return fmt.Errorf("storenode: listen on %s: %w", s.cfg.Listen, err)
	}
	s.addr = addr
	return nil
}

// gnetAddr reports the address of the engine's listener (the port a port-0 listen got).
func gnetAddr(eng gnet.Engine) (net.Addr, error) {
	fd, err := eng.Dup()
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return nil, err
	}
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		return &net.TCPAddr{IP: net.IP(sa.Addr[:]).To16(), Port: sa.Port}, nil
	case *unix.SockaddrInet6:
		return &net.TCPAddr{IP: net.IP(sa.Addr[:]), Port: sa.Port}, nil
	}
	return nil, fmt.Errorf("listener address of type %T", sa)
}

// stopGnet stops the gnet engine, which closes every connection (OnClose runs for each), and
// waits for gnet.Run to return. Engine.Stop polls every 500ms for the end, so it is given an
// ended context (it still starts the shutdown) and the end is awaited on Run instead.
func (s *Server) stopGnet() {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = s.gnetEng.Stop(ctx)
	<-s.runDone
}

func (h *gnetHandler) OnBoot(eng gnet.Engine) gnet.Action {
	h.booted <- eng
	return gnet.None
}

func (h *gnetHandler) OnOpen(c gnet.Conn) ([]byte, gnet.Action) {
	remote := "?"
	if a := c.RemoteAddr(); a != nil {
		remote = a.String()
	}
	sess := h.srv.newSession(&gnetTransport{c: c}, remote)
	c.SetContext(sess)
	refusal, linger := h.srv.admit(sess)
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
	if need := sess.needBytes; need > 0 && c.InboundBuffered() < need {
		return gnet.None // the rest of a large frame: do not re-peek what is already buffered
	}
	buf, _ := c.Peek(-1)
	n, closeNow := sess.inbound(buf)
	if n > 0 {
		_, _ = c.Discard(n)
	}
	if closeNow {
		return gnet.Close
	}
	return gnet.None
}

func (h *gnetHandler) OnClose(c gnet.Conn, err error) gnet.Action {
	if sess, _ := c.Context().(*session); sess != nil {
		sess.closed(err)
	}
	return gnet.None
}

// gnetTransport is a session's gnet connection.
type gnetTransport struct{ c gnet.Conn }

// writeLoop writes on the event loop: synchronous, the bytes are written or copied into gnet's
// outbound buffer when it returns. A client that lets more than outboundMaxBytes pile up
// unread is cut off.
func (t *gnetTransport) writeLoop(bufs [][]byte) error {
	if _, err := t.c.Writev(bufs); err != nil {
		return err
	}
	if n := t.c.OutboundBuffered(); n > outboundMaxBytes {
		return fmt.Errorf("storenode: client does not read its replies: %d bytes queued: %w", n, sgio.ErrBusy)
	}
	return nil
}

// writeAsync hands bufs to the event loop; done runs there once they are written or copied.
func (t *gnetTransport) writeAsync(bufs [][]byte, done func(error)) error {
	return t.c.AsyncWritev(bufs, func(_ gnet.Conn, err error) error {
		done(err)
		return nil
	})
}

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
