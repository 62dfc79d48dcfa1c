package server

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weftdb/weft/sgio"
)

// The accept loop and admission. The server accepts on a net.Listener of its own, not in
// gnet: gnet v2.9.7 shuts its whole engine down on most accept errors (EMFILE among them),
// which would leave the process alive with no listener. Here an accept error is never fatal:
// it is counted (Stats.AcceptErrors), logged at a bounded rate, and retried after a
// back-off that doubles from acceptBackoffMin to acceptBackoffMax (reset by the next
// success). An accepted connection is admitted (below) and handed to a gnet event loop
// (Engine.Register) or to the TLS goroutines.
//
// Admission. Connections still in the handshake have limits of their own, separate from the
// sessions': at most MaxHandshakes at once and MaxHandshakesPerSource from one source address.
// A new connection over either limit evicts a handshaking connection (of its source, or
// overall) instead of being refused, so idle or slow sockets cannot hold the handshake slots
// against a client that completes its handshake promptly. The one evicted is the oldest of
// the lowest stage (hsStage): first a connection whose proof was wrong (it only waits for
// AuthFailDelay to be told), then one that has not yet sent a whole Hello (an idle socket, a
// slowloris), and only then one that was answered with HelloReply and owes its Auth. So a
// flood of sockets that send nothing, or a loop of wrong proofs, never evicts a client that
// is mid-handshake; a flood that sends valid Hellos does, once MaxHandshakesPerSource newer
// such connections of its source (MaxHandshakes overall) arrive during the client's last
// round trip: every transaction node of a host shares its source address, so the per-source
// limit is the one such a flood has to beat (docs/operations.md). Authenticated sessions and handshaking connections together are bounded by MaxConns;
// a connection over it evicts a handshaking one when there is one, else it is refused (all
// slots belong to authenticated sessions). Refusals and evictions are logged at most
// refusalLogPerSec times a second, with a count of the lines suppressed.

const (
	acceptBackoffMin = 5 * time.Millisecond
	acceptBackoffMax = time.Second
	// refusalLogPerSec bounds the refusal, eviction and accept-error log lines per second.
	refusalLogPerSec = 10
)

// acceptLoop accepts on ln until it is closed, handing each connection to serve. It runs on
// its own goroutine; stop ends its back-off waits.
func (s *Server) acceptLoop(ln net.Listener, stop <-chan struct{}, serve func(net.Conn)) {
	backoff := time.Duration(0)
	for {
		c, err := ln.Accept()
		if err == nil {
			backoff = 0
			serve(c)
			continue
		}
		if errors.Is(err, net.ErrClosed) {
			return
		}
		select {
		case <-stop:
			return
		default:
		}
		s.counters.acceptErrors.Add(1)
		backoff = min(max(2*backoff, acceptBackoffMin), acceptBackoffMax)
		s.limitedLog("storenode: accept failed; retrying", "err", err, "backoff", backoff)
		t := time.NewTimer(backoff)
		select {
		case <-stop:
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// limitedLog writes a warning unless refusalLogPerSec lines were written this second; then it
// counts the line, and the next line written reports how many were suppressed.
func (s *Server) limitedLog(msg string, args ...any) {
	now := time.Now().UnixNano()
	l := &s.logLimit
	l.mu.Lock()
	if now-l.windowStart >= int64(time.Second) {
		l.windowStart, l.lines = now, 0
	}
	if l.lines >= refusalLogPerSec {
		l.suppressed++
		l.mu.Unlock()
		return
	}
	l.lines++
	suppressed := l.suppressed
	l.suppressed = 0
	l.mu.Unlock()
	if suppressed > 0 {
		args = append(args, "suppressed_before", suppressed)
	}
	s.log.Warn(msg, args...)
}

// logLimiter is limitedLog's state.
type logLimiter struct {
	mu          sync.Mutex
	windowStart int64
	lines       int
	suppressed  uint64
}

// refusalLog logs a refused or failed connection at a bounded rate.
func (s *Server) refusalLog(sess *session, msg string, reason error) {
	s.limitedLog(msg, "conn", sess.id, "remote", sess.remote, "reason", reason)
}

// admission is the server's count of connections by state; guarded by Server.mu.
type admission struct {
	handshaking hsList         // in the handshake, oldest first
	perSource   map[string]int // handshaking connections by source address
	authed      int            // authenticated sessions
	lingering   int            // refused connections kept open to be told why
}

// Handshake stages (session.hsStage, guarded by Server.mu): the eviction order.
const (
	hsFailed  uint8 = iota // a wrong proof: waits for AuthFailDelay only to be told
	hsFresh                // no whole Hello yet
	hsHelloed              // HelloReply sent: owes its Auth
	hsStages
)

// hsList is an intrusive list of handshaking sessions, oldest first.
type hsList struct {
	head, tail *session
	n          int
}

func (l *hsList) push(s *session) {
	s.hsPrev, s.hsNext = l.tail, nil
	if l.tail != nil {
		l.tail.hsNext = s
	} else {
		l.head = s
	}
	l.tail = s
	s.inHandshake = true
	l.n++
}

func (l *hsList) remove(s *session) {
	if !s.inHandshake {
		return
	}
	if s.hsPrev != nil {
		s.hsPrev.hsNext = s.hsNext
	} else {
		l.head = s.hsNext
	}
	if s.hsNext != nil {
		s.hsNext.hsPrev = s.hsPrev
	} else {
		l.tail = s.hsPrev
	}
	s.hsPrev, s.hsNext, s.inHandshake = nil, nil, false
	l.n--
}

// victim reports the handshaking session to evict, of source src when src is not empty: the
// oldest of the lowest stage. One pass over at most MaxHandshakes sessions.
func (l *hsList) victim(src string) *session {
	var best [hsStages]*session
	for x := l.head; x != nil; x = x.hsNext {
		if (src == "" || x.source == src) && best[x.hsStage] == nil {
			if x.hsStage == hsFailed {
				return x
			}
			best[x.hsStage] = x
		}
	}
	for _, x := range best {
		if x != nil {
			return x
		}
	}
	return nil
}

// setHandshakeStage records a handshaking session's progress (the eviction order); the
// session's loop calls it.
func (s *Server) setHandshakeStage(sess *session, stage uint8) {
	s.mu.Lock()
	sess.hsStage = stage
	s.mu.Unlock()
}

// sourceOf is the source address of a remote "host:port": its host.
func sourceOf(remote string) string {
	if host, _, err := net.SplitHostPort(remote); err == nil {
		return host
	}
	return remote
}

// admit registers a new connection's session, or reports why it is refused; it may evict
// older handshaking connections to make room (see the file's doc). A refused session is still
// registered (it answers the client's Hello with the reason, then closes); linger says
// whether there is room for that, else the connection closes at once.
func (s *Server) admit(sess *session) (refusal error, linger bool) {
	s.conns.Add(1)
	sess.source = sourceOf(sess.remote)
	var evicted []*session
	s.mu.Lock()
	s.sessions[sess] = struct{}{}
	a := &s.adm
	if a.perSource == nil {
		a.perSource = make(map[string]int)
	}
	evict := func(src string) bool {
		v := a.handshaking.victim(src)
		if v == nil {
			return false
		}
		s.leaveHandshakeLocked(v)
		evicted = append(evicted, v)
		return true
	}
	switch {
	case s.requests.isDraining():
		refusal = fmt.Errorf("storenode: server is shutting down: %w", sgio.ErrShuttingDown)
	default:
		if a.perSource[sess.source] >= s.cfg.MaxHandshakesPerSource {
			evict(sess.source)
		}
		if a.handshaking.n >= s.cfg.MaxHandshakes {
			evict("")
		}
		if a.authed+a.handshaking.n >= s.cfg.MaxConns && !evict("") {
			refusal = fmt.Errorf("storenode: %d connections open, the limit: %w", s.cfg.MaxConns, sgio.ErrBusy)
		}
	}
	if refusal == nil {
		sess.hsStage = hsFresh
		a.handshaking.push(sess)
		a.perSource[sess.source]++
	} else if linger = a.lingering < rejectLingerMax; linger {
		a.lingering++
		sess.lingering = true
	}
	s.mu.Unlock()
	for _, v := range evicted {
		s.counters.evictions.Add(1)
		s.limitedLog("storenode: closing a handshaking connection to make room", "conn", v.id, "remote", v.remote)
		v.closeWith("evicted from the handshake slots", slog.LevelDebug)
	}
	if refusal == nil {
		s.counters.accepted.Add(1)
		return nil, false
	}
	s.counters.rejected.Add(1)
	s.refusalLog(sess, "storenode: connection refused", refusal)
	return refusal, linger
}

// leaveHandshakeLocked takes a session out of the handshake counts. Caller holds s.mu.
func (s *Server) leaveHandshakeLocked(sess *session) {
	if !sess.inHandshake {
		return
	}
	a := &s.adm
	a.handshaking.remove(sess)
	if a.perSource[sess.source]--; a.perSource[sess.source] <= 0 {
		delete(a.perSource, sess.source)
	}
}

// authenticated moves a session from the handshake counts to the sessions'.
func (s *Server) authenticated(sess *session) {
	s.mu.Lock()
	if sess.inHandshake {
		s.leaveHandshakeLocked(sess)
		s.adm.authed++
		sess.countedAuthed = true
	}
	s.mu.Unlock()
}

// forget unregisters a closed session.
func (s *Server) forget(sess *session) {
	s.mu.Lock()
	delete(s.sessions, sess)
	s.leaveHandshakeLocked(sess)
	if sess.countedAuthed {
		sess.countedAuthed = false
		s.adm.authed--
	}
	if sess.lingering {
		sess.lingering = false
		s.adm.lingering--
	}
	hook := s.closeHook
	s.mu.Unlock()
	s.conns.Add(-1)
	if hook != nil {
		hook(sess)
	}
}

// admissionStats reports the handshaking and authenticated counts.
func (s *Server) admissionStats() (handshaking, authed int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.adm.handshaking.n, s.adm.authed
}

// fatalFlag records that the transport stopped on its own.
type fatalFlag struct {
	once sync.Once
	ch   chan struct{}
	err  atomic.Pointer[error]
}

func (f *fatalFlag) init() { f.once.Do(func() { f.ch = make(chan struct{}) }) }

func (f *fatalFlag) set(err error) {
	f.init()
	if f.err.CompareAndSwap(nil, &err) {
		close(f.ch)
	}
}

func (f *fatalFlag) get() error {
	if p := f.err.Load(); p != nil {
		return *p
	}
	return nil
}
