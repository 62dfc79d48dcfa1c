package server

import (
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/weftdb/weft/sgio"
)

// The TLS transport. gnet has no TLS, so with Config.TLS the server accepts crypto/tls
// connections on a net.Listener and gives each two goroutines: a reader, which is the
// session's loop (it feeds inbound bytes to the same session code as gnet's event loop and
// writes the replies produced meanwhile), and a writer, which carries the writes started by
// request goroutines (writeAsync). The session's busy flag keeps the two from writing at once.

// startTLS starts the accept loop of TLS connections on ln, which Start has bound.
func (s *Server) startTLS(ln net.Listener) {
	s.tlsLn = ln
	s.addr = ln.Addr()
	s.stopAcc = make(chan struct{})
	s.connWG.Add(1)
	go s.acceptTLS(ln)
}

// stopTLS closes the listener and every connection, and waits for their goroutines.
func (s *Server) stopTLS() {
	close(s.stopAcc)
	_ = s.tlsLn.Close()
	s.mu.Lock()
	for sess := range s.sessions {
		sess.closeWith("server stopped", slog.LevelDebug)
	}
	s.mu.Unlock()
	s.connWG.Wait()
}

func (s *Server) acceptTLS(ln net.Listener) {
	defer s.connWG.Done()
	s.acceptLoop(ln, s.stopAcc, func(c net.Conn) {
		t := &tlsTransport{conn: tls.Server(c, s.cfg.TLS), raw: c, writes: make(chan tlsWrite, 1), resume: make(chan struct{}, 1), stop: make(chan struct{}), timeout: s.cfg.WriteTimeout}
		sess := s.newSession(t, c.RemoteAddr().String())
		refusal, linger := s.admit(sess)
		if refusal != nil && !linger {
			// No room to tell it why (that would take a TLS handshake): closed at once, as
			// gnet's OnOpen does, so a flood beyond MaxConns holds nothing.
			sess.closed(refusal)
			_ = c.Close()
			return
		}
		s.connWG.Add(2)
		go t.writer(s)
		go s.serveTLS(sess, t, refusal)
	})
}

// serveTLS runs the TLS handshake (within the auth deadline), then the connection's reader
// loop: read, hand whole frames to the session, keep the rest.
func (s *Server) serveTLS(sess *session, t *tlsTransport, refusal error) {
	defer s.connWG.Done()
	var err error
	defer func() {
		sess.closed(err) // first: no write starts once the session is closed
		t.close()
	}()
	if refusal != nil { // lingering: refused connections without room are closed at accept
		sess.refuse()
	} else {
		sess.armAuthTimer()
	}
	tc := t.conn.(*tls.Conn)
	_ = tc.SetDeadline(time.Now().Add(s.cfg.AuthTimeout))
	if err = tc.Handshake(); err != nil {
		// A stranger's doing (a scanner, plain bytes, an eviction): logged at a bounded rate.
		s.limitedLog("storenode: closing connection: TLS handshake failed", "conn", sess.id, "remote", sess.remote, "err", err)
		return
	}
	_ = tc.SetDeadline(time.Time{})
	if refusal != nil {
		out := sgio.AppendFrame(nil, 0, sgio.NewErrorReply(refusal))
		_ = tc.SetWriteDeadline(time.Now().Add(t.timeout))
		_, _ = tc.Write(out)
	}
	// The buffer starts small and doubles as bytes arrive, up to the frame being read (never
	// beyond what its header declares, nor HeaderSize+MaxBody): a client that declares a large
	// frame and sends nothing more holds no more memory than it sent, times two. Before
	// authentication frames are handshake-sized (session.inbound), so a stranger cannot grow it.
	buf := make([]byte, 0, tlsReadBufMin)
	for {
		if !sess.paused {
			if len(buf) == cap(buf) {
				size := min(2*cap(buf), sgio.HeaderSize+int(s.cfg.MaxBody))
				if need := sess.needBytes; need > len(buf) {
					size = min(size, need)
				}
				grown := make([]byte, len(buf), size)
				copy(grown, buf)
				buf = grown
				if h := tlsReadBufGrown; h != nil {
					h(cap(buf))
				}
			}
			var n int
			n, err = tc.Read(buf[len(buf):cap(buf)])
			buf = buf[:len(buf)+n]
			if err != nil {
				return
			}
			if sess.needBytes > 0 && len(buf) < sess.needBytes {
				continue
			}
		}
		used, closeNow := sess.inbound(buf)
		buf = buf[:copy(buf, buf[used:])]
		if closeNow {
			return
		}
		if sess.paused && used == 0 {
			select { // the replies of earlier turns wait for the writer: so does the reader
			case <-t.resume:
			case <-t.stop:
				return
			}
		}
		if len(buf) == 0 && cap(buf) > tlsReadBufKeep {
			buf = make([]byte, 0, tlsReadBufMin) // a large frame is done: give its buffer back
		}
	}
}

// tlsReadBufGrown, when set (by a test, before the server starts), is called by a TLS
// reader with its buffer's new capacity each time the buffer grows.
var tlsReadBufGrown func(capacity int)

// The TLS reader's buffer: its first size, and the most it keeps once empty.
const (
	tlsReadBufMin  = 4 << 10
	tlsReadBufKeep = 1 << 20
)

// tlsTransport is a session's TLS connection.
type tlsTransport struct {
	conn    net.Conn // the tls.Conn
	raw     net.Conn // the TCP connection under it
	timeout time.Duration
	writes  chan tlsWrite // cap 1: the session starts one write at a time
	resume  chan struct{} // cap 1: wake's signal to a paused reader
	stop    chan struct{}
	once    sync.Once
	flat    []byte // the flattened write; used by whoever holds the session's busy flag
}

type tlsWrite struct {
	bufs [][]byte
	done func(error)
}

// writeLoop writes bufs as one TLS write (one record run, not one per slice).
func (t *tlsTransport) writeLoop(bufs [][]byte) error {
	t.flat = t.flat[:0]
	for _, b := range bufs {
		t.flat = append(t.flat, b...)
	}
	_ = t.conn.SetWriteDeadline(time.Now().Add(t.timeout))
	_, err := t.conn.Write(t.flat)
	if cap(t.flat) > 1<<20 {
		t.flat = nil
	}
	return err
}

func (t *tlsTransport) writeAsync(bufs [][]byte, done func(error)) error {
	select {
	case t.writes <- tlsWrite{bufs, done}:
		return nil
	default:
		return errors.New("storenode: TLS write queue full") // the session's busy flag prevents this
	}
}

// wake lets the reader run another turn: at once when it stopped early with bytes left, or
// when it paused for the write in progress (the writer calls wake when it is done).
func (t *tlsTransport) wake() {
	select {
	case t.resume <- struct{}{}:
	default:
	}
}

// close closes the TCP connection under the TLS one: at once, without the close_notify
// alert that tls.Conn.Close would write (and could wait up to its write deadline for).
func (t *tlsTransport) close() {
	t.once.Do(func() {
		close(t.stop)
		_ = t.raw.Close()
	})
}

// writer carries writeAsync's writes; once the connection is closed it fails the one left.
func (t *tlsTransport) writer(s *Server) {
	defer s.connWG.Done()
	for {
		select {
		case w := <-t.writes:
			w.done(t.writeLoop(w.bufs))
		case <-t.stop:
			select {
			case w := <-t.writes:
				w.done(net.ErrClosed)
			default:
			}
			return
		}
	}
}
