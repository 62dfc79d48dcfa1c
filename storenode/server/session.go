package server

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/logicpage"
	"github.com/weftdb/weft/sgio"
	"github.com/weftdb/weft/storenode"
)

// A session is one connection's protocol state: the handshake, the requests in flight and the
// replies waiting to be written. The same code serves gnet connections and TLS net.Conns
// (transport).
//
// Invariants:
//   - Inbound bytes are handled by one goroutine at a time, the connection's "loop" (a gnet
//     event loop, or the TLS connection's reader): state, owner, nonces and needBytes belong
//     to it.
//   - A request counts as in flight (inflight here, Server.requests there) from its
//     dispatch until its reply has been handed to the transport (written, or copied into its
//     outbound buffer); an Error reply to a request that was refused (ErrBusy, ErrShuttingDown,
//     malformed) is not counted. So a client that respects HelloReply.MaxInflight never meets
//     ErrBusy: its in-flight count is never below ours.
//   - At most one write is in progress (busy). Replies accumulate in pending meanwhile and go
//     out in the next write; sending is what the write in progress carries, untouched until
//     it is done.
//   - Once closed, nothing is written and no method of the transport is called again (after
//     gnet stops, a late call could reach a reused file descriptor); replies that arrive
//     later are dropped, their requests ended.
type session struct {
	srv    *Server
	tr     transport
	id     uint64
	remote string
	source string // remote's host: the per-source handshake limit's key

	// Admission, guarded by srv.mu.
	hsPrev, hsNext *session
	inHandshake    bool  // counted among the handshaking connections
	hsStage        uint8 // how far its handshake got: the eviction order (hsFresh...)
	countedAuthed  bool  // counted among the authenticated sessions
	lingering      bool  // counted among the refused connections kept open

	// The loop's own fields.
	state       sessionState
	role        role                    // the roles of the secret that verified the client's proof (roles.go)
	key         []byte                  // that secret's HMAC key: the server's proof is made with it
	ownerKey    [sgio.OwnerKeySize]byte // the owner id's derived key (authRole); key when the session proved it
	ownerBound  bool                    // the session proved its owner id's derived key, not the clients' secret
	owner       uint64
	incarnation storenode.Incarnation // the Hello's; the owner id is claimed with it once authenticated
	name        string
	clientNonce [sgio.NonceSize]byte
	serverNonce [sgio.NonceSize]byte
	transcript  [sgio.TranscriptSize]byte // of the Hello and the HelloReply: the proofs cover it
	replyMax    uint32                    // the largest reply body the client accepts
	needBytes   int                       // a frame of this many bytes is incomplete: wait until they are buffered
	paused      bool                      // the last turn stopped early (turnReplyMaxBytes); bytes remain
	readOn      bool                      // read this turn even behind a write in progress (gnet: its inbound buffer is over stoppedInboundMaxBytes)
	commitStart bool                      // a commit of this turn needs the commit goroutine started
	turnReads   *readTurn                 // the slow-path reads of the current turn, for one goroutine; nil when none
	turnNow     int64                     // the engine's clock in this turn, UnixNano; 0 until read
	refusal     error                     // why admission refused the connection, nil when admitted
	linger      bool                      // a refused connection is kept open to be told why

	ownerSeen  atomic.Uint64 // owner, for the logs of timers
	authed     atomic.Bool
	claimed    atomic.Bool // the owner id is claimed for this connection (Engine.Connect)
	inflight   atomic.Int64
	lastActive atomic.Int64 // time.Now().UnixNano() of the last inbound bytes
	lastRenew  atomic.Int64 // engine clock, UnixNano, of the last lease renewal

	mu              sync.Mutex
	pending         sgio.Writer // replies not yet handed to the transport
	sending         sgio.Writer // the write in progress
	pendingCounted  int         // in-flight requests answered in pending
	pendingKeep     []*[]byte   // pooled reply buffers (getRowBuf) to release once pending is written
	sendingKeep     []*[]byte
	busy            bool          // a write is in progress
	wantWake        bool          // the loop paused for the write in progress: wake it when done
	room            chan struct{} // closed (and dropped) when a write finished or the session closed: reserveRoom's wake-up; nil when nobody waits
	inLoop          bool          // the loop is handling inbound bytes and will write when it is done
	isClosed        bool
	closeAfterWrite bool            // close once the pending replies are written (a delayed auth failure)
	commits         []commitRequest // waiting for the commit goroutine, in arrival order
	queuedBytes     int64           // bytes of the bodies in commits and being submitted, and of reads waiting for a goroutine
	reserved        int64           // reply bytes reserved by replies being built (reserveRoom)
	heldPeak        int64           // the most reply bytes held (pending, sending, reserved) at once; tests read it
	committing      bool            // the commit goroutine runs
	asyncCounted    int             // in-flight requests answered by the async write in progress
	authTimer       *time.Timer
	idleTimer       *time.Timer

	backup backupConn // the connection's online backup (server_backup.go)

	// Made once (newSession), so that the hot paths allocate no closure.
	commitLoopFn func()      // s.commitLoop
	asyncDoneFn  func(error) // s.asyncWriteDone: the transport's writeAsync callback
	// The commit goroutine's own, reused from one run to the next (commitLoop).
	commitBatch storenode.Batch
	commitQueue []commitRequest
	// The loop's own, reused per request: a ReadPages is parsed into loopRead (a read that
	// leaves the loop takes a copy, readRequest owns its message) and answered inline with
	// inlineSegs in inlineReply, which the Writer has encoded before reply returns.
	loopRead    sgio.ReadPages
	inlineSegs  []base.Segment
	inlineReply sgio.Segments
}

type sessionState uint8

const (
	stateHello   sessionState = iota // waiting for Hello
	stateAuth                        // HelloReply sent, waiting for Auth
	stateOpen                        // authenticated
	stateRefused                     // refused at connect: close on the first frame
	stateFailed                      // a wrong proof: answered and closed after AuthFailDelay
)

// transport is a session's connection.
type transport interface {
	// writeLoop writes bufs synchronously. Only the connection's loop calls it (gnet: the
	// event loop, TLS: the reader or the writer goroutine), without the session's lock, and
	// only while the session holds busy; bufs may be reused once it returns.
	writeLoop(bufs [][]byte) error
	// writeAsync starts writing bufs and returns; done runs once, later and on the loop,
	// when the bytes are written (or have failed). Called with the session's lock held and
	// busy set; it must not call done before returning. A non-nil error means done will not
	// run.
	writeAsync(bufs [][]byte, done func(error)) error
	// close closes the connection; any goroutine, idempotent.
	close()
	// wake asks the loop for another turn on the inbound bytes already buffered (the turn
	// that called it stopped early: turnReplyMaxBytes); only the loop calls it.
	wake()
}

// attach gives a session accepted before its transport existed its transport; false when it
// was closed (evicted) meanwhile.
func (s *session) attach(tr transport) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tr = tr
	return !s.isClosed
}

// isClosedNow reports whether the session is closed; any goroutine.
func (s *session) isClosedNow() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.isClosed
}

// connTokens numbers connections across the process's servers: Engine.Connect needs a token
// unique per connection of the engine, and several servers may serve one (Config.Engine).
var connTokens atomic.Uint64

func (s *Server) newSession(tr transport, remote string) *session {
	sess := &session{srv: s, tr: tr, id: connTokens.Add(1), remote: remote}
	sess.commitLoopFn, sess.asyncDoneFn = sess.commitLoop, sess.asyncWriteDone
	sess.lastActive.Store(time.Now().UnixNano())
	return sess
}

// logger is the server's logger with the session's identity; any goroutine may call it.
func (s *session) logger() *slog.Logger {
	return s.srv.log.With("conn", s.id, "remote", s.remote, "owner", s.ownerSeen.Load())
}

// armAuthTimer starts the auth deadline, counted from the connection's start.
func (s *session) armAuthTimer() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.isClosed {
		s.authTimer = time.AfterFunc(s.srv.cfg.AuthTimeout, s.authExpired)
	}
}

// refuse marks a session refused at connect: its first frame closes it, and so does the auth
// deadline.
func (s *session) refuse() {
	s.state = stateRefused
	s.armAuthTimer()
}

func (s *session) authExpired() {
	if s.authed.Load() {
		return
	}
	s.srv.counters.authTimeouts.Add(1)
	reason := fmt.Sprintf("no authentication within %v", s.srv.cfg.AuthTimeout)
	s.srv.limitedLog("storenode: closing connection", "conn", s.id, "remote", s.remote, "reason", reason)
	s.closeWith(reason, slog.LevelDebug)
}

// idleCheck runs when the idle timer fires: it closes an idle session or re-arms the timer.
func (s *session) idleCheck() {
	idle := s.srv.cfg.IdleTimeout
	since := time.Duration(time.Now().UnixNano() - s.lastActive.Load())
	if s.inflight.Load() == 0 && since >= idle {
		s.srv.counters.idleCloses.Add(1)
		s.closeWith(fmt.Sprintf("idle for %v", idle.Round(time.Millisecond)), slog.LevelInfo)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.isClosed {
		s.idleTimer.Reset(max(idle-since, idle/4))
	}
}

// closeWith closes the connection from any goroutine, logging why.
func (s *session) closeWith(reason string, level slog.Level) {
	s.mu.Lock()
	if s.isClosed {
		s.mu.Unlock()
		return
	}
	// Log first: the peer may act on the close at once.
	s.logger().Log(context.Background(), level, "storenode: closing connection", "reason", reason)
	s.markClosedLocked()
	if s.tr != nil { // nil: accepted, not yet on its loop; OnOpen will close it
		s.tr.close()
	}
	s.mu.Unlock()
}

// markClosedLocked stops the session's writes and timers and drops its pending replies.
// Caller holds mu.
func (s *session) markClosedLocked() {
	s.isClosed = true
	s.signalRoomLocked()
	if s.authTimer != nil {
		s.authTimer.Stop()
	}
	if s.idleTimer != nil {
		s.idleTimer.Stop()
	}
	s.pending.Reset()
	s.endRequests(s.pendingCounted)
	s.pendingCounted = 0
	for _, b := range s.pendingKeep {
		putRowBuf(b) // nothing references it: pending was reset
	}
	s.pendingKeep = nil
}

// closed is called once the transport has closed the connection.
func (s *session) closed(err error) {
	s.mu.Lock()
	if !s.isClosed {
		s.markClosedLocked()
	}
	// Release the reply buffers now, not when the last reference goes (a write in progress
	// keeps its own until it is done).
	s.pending = sgio.Writer{}
	if !s.busy {
		s.sending = sgio.Writer{}
	}
	s.turnReads = nil
	s.mu.Unlock()
	if err != nil {
		s.logger().Debug("storenode: connection closed", "err", err)
	} else {
		s.logger().Debug("storenode: connection closed")
	}
	s.backup.abandon()
	if s.claimed.Load() {
		s.srv.eng.Disconnect(s.owner, s.id)
	}
	s.srv.forget(s)
}

// claimOwner claims the session's owner id for this connection, by its incarnation
// (Engine.Connect), once the client is authenticated; a session without an owner id claims
// nothing. A later claim by the same incarnation closes this connection. On the loop; it takes
// the engine's identity lock only (Engine.Connect: identMu, held for map updates), never mu.
func (s *session) claimOwner() error {
	if s.owner == 0 {
		return nil
	}
	if err := s.srv.eng.Connect(s.owner, s.incarnation, s.id, func() {
		s.closeWith("replaced by a new connection of the same incarnation", slog.LevelInfo)
	}); err != nil {
		return err
	}
	s.claimed.Store(true)
	return nil
}

// endRequests ends k in-flight requests.
func (s *session) endRequests(k int) {
	if k > 0 {
		s.inflight.Add(int64(-k))
		s.srv.requests.end(k)
	}
}

// inbound consumes the whole frames at the start of buf, the connection's unread inbound
// bytes, and reports how many bytes it consumed and whether the connection must be closed
// (the caller closes it: gnet.Close, or the TLS reader's return). Only the connection's loop
// calls it. buf is read only during the call: whatever a request needs later is parsed or
// copied out of it first (see the package doc's buffer lifetimes). The replies it produces
// are written with one write before it returns (when no write is in progress; else right
// after that write), an Error reply before a close included.
func (s *session) inbound(buf []byte) (n int, closeNow bool) {
	s.lastActive.Store(time.Now().UnixNano())
	s.mu.Lock()
	s.inLoop = true
	s.mu.Unlock()
	defer func() {
		s.startCommits()
		if t := s.turnReads; t != nil {
			s.turnReads = nil
			s.srv.workers.Add(1)
			go t.run() // a method value made with the pooled turn: no closure
		}
		s.mu.Lock()
		s.inLoop = false
		s.mu.Unlock()
		s.flushLoop()
		if closeNow {
			s.mu.Lock()
			if !s.isClosed {
				s.markClosedLocked()
			}
			s.mu.Unlock()
		}
	}()
	s.needBytes, s.turnNow, s.paused = 0, 0, false
	s.mu.Lock()
	if s.busy && s.pending.Len() >= turnReplyMaxBytes && !s.readOn {
		// The replies of earlier turns wait for the write in progress: read nothing more
		// until it is done (writeDone wakes the loop).
		s.wantWake, s.paused = true, true
		s.mu.Unlock()
		return 0, false
	}
	s.mu.Unlock()
	for n < len(buf) {
		// Before authentication only handshake-sized frames are read: a stranger's frame
		// header that claims more is refused before its body is waited for (or buffered).
		limit := s.srv.cfg.MaxBody
		if s.state != stateOpen {
			limit = sgio.HandshakeBodyMax()
		}
		f, size, err := sgio.Decode(buf[n:], limit)
		switch {
		case err == sgio.ErrNeedMore:
			if size > sgio.HeaderSize {
				s.needBytes = size
			}
			return n, false
		case errors.Is(err, sgio.ErrUnknownType) && s.state == stateOpen:
			// The frame is intact: refuse it and go on.
			s.srv.counters.rejectedFrames.Add(1)
			s.srv.counters.bytesIn.Add(uint64(size))
			s.replyError(f.ID, err, false)
			n += size
			continue
		case err != nil:
			s.srv.counters.rejectedFrames.Add(1)
			return n, s.reject(rawID(buf[n:]), err, "bad frame")
		}
		n += size
		s.srv.counters.bytesIn.Add(uint64(size))
		if !s.handle(f) {
			return n, true
		}
		if n < len(buf) && s.pendingBytes() >= turnReplyMaxBytes {
			// The turn holds its bound of replies: write them, and take the rest of the
			// inbound bytes in another turn.
			s.paused = true
			s.tr.wake()
			return n, false
		}
	}
	return n, false
}

// pendingBytes reports the bytes of the replies not yet handed to the transport.
func (s *session) pendingBytes() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pending.Len()
}

// rawID reads the request id of a frame header that failed to decode, or 0.
func rawID(b []byte) uint64 {
	if len(b) < 16 {
		return 0
	}
	return binary.LittleEndian.Uint64(b[8:16])
}

// reject answers a frame that breaks the protocol with an Error reply and reports true: the
// connection is closed once the reply is written.
func (s *session) reject(id uint64, err error, what string) bool {
	if s.state == stateOpen {
		s.logger().Warn("storenode: closing connection: "+what, "err", err)
	} else {
		// Anyone can connect: what strangers do is logged at a bounded rate.
		s.srv.limitedLog("storenode: closing connection: "+what, "conn", s.id, "remote", s.remote, "err", err)
	}
	s.replyError(id, err, false)
	return true
}

// handle runs one decoded frame on the loop and reports false when the connection must close.
// f.Body aliases the inbound buffer: valid during this call only.
func (s *session) handle(f sgio.Frame) bool {
	switch s.state {
	case stateRefused:
		return false // the refusal went out at connect
	case stateFailed:
		return true // the failure is answered after the delay; frames meanwhile are dropped
	case stateHello:
		if f.Type != sgio.TypeHello {
			s.srv.counters.authFailures.Add(1)
			return !s.reject(f.ID, fmt.Errorf("storenode: %v before Hello: %w", f.Type, sgio.ErrAuthFailed), "request before authentication")
		}
		return s.hello(f)
	case stateAuth:
		if f.Type != sgio.TypeAuth {
			s.srv.counters.authFailures.Add(1)
			return !s.reject(f.ID, fmt.Errorf("storenode: %v before Auth: %w", f.Type, sgio.ErrAuthFailed), "request before authentication")
		}
		return s.auth(f)
	}
	if !f.Type.IsRequest() || f.Type == sgio.TypeHello || f.Type == sgio.TypeAuth {
		s.srv.counters.rejectedFrames.Add(1)
		return !s.reject(f.ID, fmt.Errorf("storenode: %v is not a request of an open session: %w", f.Type, sgio.ErrMalformed), "protocol violation")
	}
	s.srv.counters.requests.Add(1)
	if !s.role.allows(f.Type) {
		s.forbid(f) // before the body is parsed, a lease renewed or anything queued
		return true
	}
	if s.renewDue() {
		s.renew() // on the loop: Engine.Renew takes no engine lock
	}
	if f.Type == sgio.TypeCommit {
		s.commit(f)
		return true
	}
	if f.Type == sgio.TypeBackup {
		s.backupRequest(f)
		return true
	}
	if f.Type == sgio.TypeTxnPrepare {
		s.txnPrepare(f)
		return true
	}
	if f.Type == sgio.TypeMoveWrite {
		s.moveWrite(f)
		return true
	}
	var readBytes int64
	if f.Type == sgio.TypeReadPages || f.Type == sgio.TypePageDir {
		// A read that waits for a goroutine keeps its parsed request: its body counts against
		// the queue's bounds (MaxQueuedBytes, MaxQueuedBytesTotal), checked before it is parsed.
		readBytes = int64(len(f.Body))
		if err := s.queueFull(readBytes); err != nil {
			s.srv.counters.busyReplies.Add(1)
			s.replyError(f.ID, err, false)
			return true
		}
	}
	var m sgio.Message
	if f.Type == sgio.TypeReadPages {
		m = &s.loopRead // the loop's own: copied if the read leaves the loop (ownedRead)
		defer s.trimLoopRead()
	} else {
		m = sgio.NewMessage(f.Type)
	}
	if err := m.Parse(f.Body); err != nil {
		s.srv.counters.rejectedFrames.Add(1)
		s.replyError(f.ID, err, false)
		return true
	}
	switch f.Type {
	case sgio.TypePing:
		s.replyLoop(f.ID, &sgio.Pong{})
		return true
	case sgio.TypeAcquire:
		// An etcd grant is verified in etcd: never on the loop, it goes to a goroutine
		// below (run: bounded by MaxInflight per connection, and by the engine's
		// verification slots and timeout).
		if a := m.(*sgio.Acquire); a.Epoch != 0 && a.Flags&sgio.AcquireEtcdGrant == 0 {
			s.renewGrant(f.ID, a)
			return true
		}
	case sgio.TypeReadPages, sgio.TypePageDir:
		if f.Type == sgio.TypeReadPages && s.readInline(f.ID, m.(*sgio.ReadPages)) {
			return true
		}
		if err := s.queueAdd(readBytes); err != nil {
			s.srv.counters.busyReplies.Add(1)
			s.replyError(f.ID, err, false)
			return true
		}
		if !s.begin(f.ID) {
			s.queueRelease(readBytes)
			return true
		}
		t := s.turn()
		if f.Type == sgio.TypeReadPages {
			m = t.ownedRead(&s.loopRead)
		}
		t.reads = append(t.reads, readRequest{f.ID, m, readBytes})
		return true
	}
	if !s.begin(f.ID) {
		return true
	}
	s.srv.workers.Add(1)
	go s.run(f.ID, m)
	return true
}

// hello answers Hello with the server's limits and its challenge; the server's proof waits
// for the client's (auth).
func (s *session) hello(f sgio.Frame) bool {
	var h sgio.Hello
	if err := h.Parse(f.Body); err != nil {
		s.srv.counters.rejectedFrames.Add(1)
		return !s.reject(f.ID, err, "bad Hello")
	}
	if h.Version != sgio.Version {
		return !s.reject(f.ID, fmt.Errorf("storenode: client speaks protocol version %d, this server %d: %w",
			h.Version, sgio.Version, sgio.ErrBadVersion), "protocol version")
	}
	if h.MaxBody < minReplyBody {
		return !s.reject(f.ID, fmt.Errorf("storenode: client accepts reply bodies of %d bytes, at least %d needed: %w",
			h.MaxBody, minReplyBody, sgio.ErrMalformed), "bad Hello")
	}
	s.owner, s.name, s.clientNonce, s.incarnation = h.OwnerID, h.Name, h.Nonce, h.Incarnation
	s.ownerSeen.Store(h.OwnerID)
	s.replyMax = min(h.MaxBody, sgio.MaxBodyLimit)
	s.serverNonce = sgio.NewNonce()
	r := s.srv.hello
	r.Nonce = s.serverNonce
	s.transcript = sgio.Transcript(&h, &r)
	s.state = stateAuth
	s.srv.setHandshakeStage(s, hsHelloed)
	s.replyLoop(f.ID, &r)
	return true
}

// auth checks the client's proof: AuthOK, carrying the server's proof, opens the session; a
// wrong proof is answered with ErrAuthFailed and a close, after AuthFailDelay (never a lock
// out: each guess costs a connection and the delay).
func (s *session) auth(f sgio.Frame) bool {
	var a sgio.Auth
	if err := a.Parse(f.Body); err != nil {
		s.srv.counters.rejectedFrames.Add(1)
		return !s.reject(f.ID, err, "bad Auth")
	}
	r, key, bound, err := s.srv.authRole(s.owner, &s.ownerKey, s.serverNonce, s.clientNonce, s.transcript, a.Proof)
	if err != nil {
		s.srv.counters.authFailures.Add(1)
		s.state = stateFailed
		s.srv.setHandshakeStage(s, hsFailed)
		s.srv.refusalLog(s, "storenode: authentication failed", err)
		id := f.ID
		s.mu.Lock()
		if !s.isClosed {
			if s.authTimer != nil {
				s.authTimer.Stop()
			}
			s.authTimer = time.AfterFunc(s.srv.cfg.AuthFailDelay, func() {
				s.replyAndClose(id, fmt.Errorf("storenode: %w", err))
			})
		}
		s.mu.Unlock()
		return true
	}
	if err := s.claimOwner(); err != nil {
		return !s.reject(f.ID, err, "owner id in use")
	}
	s.state, s.role, s.key, s.ownerBound = stateOpen, r, key, bound
	s.authed.Store(true)
	s.srv.authenticated(s)
	s.mu.Lock()
	if s.authTimer != nil {
		s.authTimer.Stop()
	}
	if idle := s.srv.cfg.IdleTimeout; idle > 0 && !s.isClosed {
		s.idleTimer = time.AfterFunc(idle, s.idleCheck)
	}
	s.mu.Unlock()
	s.logger().Debug("storenode: session open", "name", s.name, "role", s.role, "ownerBound", s.ownerBound)
	s.replyLoop(f.ID, &sgio.AuthOK{Proof: sgio.ServerProof(s.key, s.clientNonce, s.serverNonce, s.transcript)})
	return true
}

// replyAndClose sends an Error reply from any goroutine and closes the connection once it is
// written.
func (s *session) replyAndClose(id uint64, err error) {
	r := sgio.NewErrorReply(err)
	r.Message = s.srv.scrubPaths(r.Message)
	s.replyThen(id, r, nil, false, true, 0)
}

// begin counts a request in flight, or answers it with ErrBusy or ErrShuttingDown and
// reports false.
func (s *session) begin(id uint64) bool {
	if s.inflight.Load() >= int64(s.srv.cfg.MaxInflight) {
		s.srv.counters.busyReplies.Add(1)
		s.replyError(id, fmt.Errorf("storenode: %d requests in flight on this connection, the limit: %w",
			s.srv.cfg.MaxInflight, sgio.ErrBusy), false)
		return false
	}
	if !s.srv.requests.begin() {
		s.replyError(id, fmt.Errorf("storenode: server is shutting down: %w", sgio.ErrShuttingDown), false)
		return false
	}
	s.inflight.Add(1)
	return true
}

// renewGrant answers a lease renewal (an Acquire with the epoch of a grant) on the loop:
// Engine.RenewGrant takes no engine lock, so neither a checkpoint nor the commits holding it,
// nor the goroutines of other requests, delay the reply; it leaves in the loop's own write at
// the end of the turn. A renewal refused (ErrFenced, ErrTableNotFound) is answered the same
// way.
func (s *session) renewGrant(id uint64, a *sgio.Acquire) {
	err := s.checkHolder(a.Owner)
	var g storenode.Grant
	if err == nil {
		g, err = s.srv.eng.RenewGrantFrom(a.Table, a.Owner, a.Epoch, s.id)
	}
	if err != nil {
		s.replyError(id, err, false)
		return
	}
	s.replyLoop(id, &sgio.Grant{Table: g.Table, LeaseMillis: uint32(min(g.Lease.Milliseconds(), 1<<32-1)),
		Owner: g.Owner, Epoch: g.Epoch, LastSeq: g.LastSeq})
}

// renewDue reports, on the loop, whether the owner's leases are due for renewal: traffic
// renews them at most every eighth of a lease. The engine's clock is read once per turn.
func (s *session) renewDue() bool {
	if s.owner == 0 {
		return false
	}
	if s.turnNow == 0 {
		s.turnNow = s.srv.eng.Now().UnixNano()
	}
	return s.turnNow-s.lastRenew.Load() >= s.srv.leaseNanos/8
}

// renew extends the owner's leases if due: any traffic from the owner counts. The loop calls
// it for every request (Engine.Renew takes no engine lock, only its lease and identity
// locks for a few stores), and request goroutines before their request.
func (s *session) renew() {
	if s.owner == 0 {
		return
	}
	now := s.srv.eng.Now().UnixNano()
	last := s.lastRenew.Load()
	if now-last < s.srv.leaseNanos/8 || !s.lastRenew.CompareAndSwap(last, now) {
		return
	}
	s.srv.eng.Renew(s.owner)
}

// checkOwner refuses a request made for another owner than the session's.
func (s *session) checkOwner(owner uint64) error {
	if owner != s.owner {
		return fmt.Errorf("storenode: session of owner %d sent a request for owner %d: %w", s.owner, owner, sgio.ErrFenced)
	}
	return nil
}

// checkHolder is checkOwner for a request about to act as the owner (a commit handed to the
// engine, an Acquire, an AllocIDs, a DropTable): it also fails once a later claim replaced this
// connection's identity, whose close is still on its way, or the id was released. That refusal
// is storenode.ErrIdentityLost (wire code IdentityLost), never ErrFenced: it says nothing of
// the owner's grants, and a transaction node that took it for a fence would latch a table whose
// grant is fine; it sends the request again on its current connection instead.
func (s *session) checkHolder(owner uint64) error {
	if err := s.checkOwner(owner); err != nil {
		return err
	}
	if owner != 0 && !s.srv.eng.HoldsIdent(owner, s.id) {
		return fmt.Errorf("storenode: owner %d, connection %d (replaced or released): %w", owner, s.id, storenode.ErrIdentityLost)
	}
	return nil
}

// run executes one request on its own goroutine and replies. Like the reads (runReads), it
// first reserves room for its reply under connReplyMaxBytes: a client that pipelines
// requests with large replies (ListTables) and reads nothing holds a bounded amount of them.
func (s *session) run(id uint64, m sgio.Message) {
	defer s.srv.workers.Done()
	size := s.replySizeBound(m)
	if !s.reserveRoom(size) {
		s.endRequests(1) // closed: no reply will go out
		return
	}
	s.renew()
	reply, keep, err := s.exec(m)
	s.replyReserved(id, reply, keep, err, size)
}

// replyReserved queues the reply to a counted request (an Error reply when err is set) and
// gives back its reservation of reserveRoom, under one lock.
func (s *session) replyReserved(id uint64, reply sgio.Message, keep *[]byte, err error, size int64) {
	if err != nil {
		r := sgio.NewErrorReply(err)
		r.Message = s.srv.scrubPaths(r.Message)
		if keep != nil {
			putRowBuf(keep)
		}
		reply, keep = r, nil
	}
	s.replyThen(id, reply, keep, true, false, size)
}

// exec executes a request other than Commit. keep is a buffer the reply's rows live in.
func (s *session) exec(m sgio.Message) (reply sgio.Message, keep *[]byte, err error) {
	e := s.srv.eng
	switch m := m.(type) {
	case *sgio.Ping:
		return &sgio.Pong{}, nil, nil
	case *sgio.CreateTable:
		// A client's tables are bounded per owner (MaxTablesPerOwner), an operator's by
		// MaxTables alone.
		var ti storenode.TableInfo
		var err error
		if s.role&roleOperator != 0 {
			ti, err = e.CreateTable(m.Name, int(m.RowBytes))
		} else {
			ti, err = e.CreateTableAs(m.Name, int(m.RowBytes), s.owner)
		}
		if err != nil {
			return nil, nil, err
		}
		return wireTableInfo(ti), nil, nil
	case *sgio.CreateClusterTable:
		if err := s.mayCreateCluster(m); err != nil {
			return nil, nil, err
		}
		l := storenode.ClusterLayout{Partitions: m.Layout.Partitions, StripePages: m.Layout.StripePages, Partition: m.Layout.Partition}
		var ti storenode.TableInfo
		var err error
		if s.role&roleOperator != 0 {
			ti, err = e.CreateClusterTable(m.Name, int(m.RowBytes), l)
		} else {
			ti, err = e.CreateClusterTableAs(m.Name, int(m.RowBytes), l, s.owner)
		}
		if err != nil {
			return nil, nil, err
		}
		return wireTableInfo(ti), nil, nil
	case *sgio.OpenTable:
		ti, err := e.OpenTable(m.Name)
		if err != nil {
			return nil, nil, err
		}
		return wireTableInfo(ti), nil, nil
	case *sgio.ListTables:
		r := &sgio.TableList{}
		for _, ti := range e.Tables() {
			r.Tables = append(r.Tables, *wireTableInfo(ti))
		}
		return s.fits(r)
	case *sgio.DropTable:
		// No epoch fences a drop: only the identity check keeps a replaced connection's
		// late request from dropping the table of the owner id's new holder.
		if err := s.checkHolder(s.owner); err != nil {
			return nil, nil, err
		}
		if err := s.mayDrop(m.Name); err != nil {
			return nil, nil, err
		}
		if err := s.dropTable(m.Name); err != nil {
			return nil, nil, err
		}
		return &sgio.OK{}, nil, nil
	case *sgio.Acquire:
		if err := s.checkHolder(m.Owner); err != nil {
			return nil, nil, err
		}
		var g storenode.Grant
		var err error
		if m.Flags&sgio.AcquireEtcdGrant != 0 {
			// Bounded by the engine's GrantVerifyTimeout and its verification slots.
			g, err = e.RegisterGrantFrom(context.Background(), m.Table, m.Owner, m.Epoch, s.id)
		} else {
			g, err = e.AcquireFrom(m.Table, m.Owner, m.Epoch, s.id)
		}
		if err != nil {
			return nil, nil, err
		}
		return &sgio.Grant{Table: g.Table, LeaseMillis: uint32(min(g.Lease.Milliseconds(), 1<<32-1)),
			Owner: g.Owner, Epoch: g.Epoch, LastSeq: g.LastSeq}, nil, nil
	case *sgio.Release:
		if err := s.checkOwner(m.Owner); err != nil {
			return nil, nil, err
		}
		if err := e.ReleaseOwner(m.Owner, s.id); err != nil {
			return nil, nil, err
		}
		return &sgio.OK{}, nil, nil
	case *sgio.AllocIDs:
		if err := s.checkHolder(m.Owner); err != nil {
			return nil, nil, err
		}
		first, count, err := e.AllocIDs(m.Table, m.Owner, m.Epoch, int(m.Pages))
		if err != nil {
			return nil, nil, err
		}
		return &sgio.IDRange{First: first, Count: count}, nil, nil
	case *sgio.ReadPages:
		return s.readPages(m)
	case *sgio.PageDir:
		limit := min(int((s.replyMax-16)/16), storenode.PageDirEntriesMax)
		if m.MaxEntries > 0 {
			limit = min(limit, int(m.MaxEntries))
		}
		if m.Hi < m.Lo {
			return nil, nil, fmt.Errorf("storenode: page directory of [%d, %d): %w", m.Lo, m.Hi, sgio.ErrMalformed)
		}
		pages, next, err := e.PageDirAs(s.owner, m.Table, m.Lo, m.Hi, limit, nil)
		if err != nil {
			return nil, nil, err
		}
		r := &sgio.PageDirReply{Next: next, Entries: make([]sgio.PageEntry, len(pages))}
		if next >= min(m.Hi, logicpage.TablePagesMax) {
			r.Next = m.Hi // the range is done, even beyond the engine's last page
		}
		for i, p := range pages {
			r.Entries[i] = sgio.PageEntry{Page: p.Page, Present: p.Present}
		}
		return r, nil, nil
	case *sgio.Stats:
		return s.fits(s.srv.statsReply())
	case *sgio.TxnDecide, *sgio.TxnApply, *sgio.TxnAsk, *sgio.TxnReport, *sgio.TxnDoubt:
		r, _, err := s.execTxn(m)
		return r, nil, err
	case *sgio.Move:
		r, err := s.execMove(m)
		return r, nil, err
	}
	return nil, nil, fmt.Errorf("storenode: %v: %w", m.Type(), sgio.ErrUnsupported)
}

// fits checks that a reply fits the client's body limit.
func (s *session) fits(m sgio.Message) (sgio.Message, *[]byte, error) {
	if size := m.BodySize(); size > int(s.replyMax) {
		return nil, nil, fmt.Errorf("storenode: %v reply of %d bytes, the client accepts %d: %w", m.Type(), size, s.replyMax, sgio.ErrFrameTooLarge)
	}
	return m, nil, nil
}

func wireTableInfo(ti storenode.TableInfo) *sgio.TableInfo {
	return &sgio.TableInfo{Table: ti.ID, RowBytes: uint16(ti.RowBytes), NextID: ti.NextID, Name: ti.Name,
		Cluster: sgio.ClusterLayout{Partitions: ti.Cluster.Partitions, StripePages: ti.Cluster.StripePages, Partition: ti.Cluster.Partition}}
}

// signalRoomLocked wakes every reserveRoom. Caller holds mu.
func (s *session) signalRoomLocked() {
	if s.room != nil {
		close(s.room)
		s.room = nil
	}
}

// Replies.

// replyLoop queues a reply produced on the loop for a request that was not counted in
// flight (the handshake, an inline Pong). The loop writes it before inbound returns.
func (s *session) replyLoop(id uint64, m sgio.Message) { s.reply(id, m, nil, false) }

// replyError queues the Error reply carrying err (sgio.NewErrorReply: its code maps back to
// the same sentinel at the client).
func (s *session) replyError(id uint64, err error, counted bool) {
	r := sgio.NewErrorReply(err)
	r.Message = s.srv.scrubPaths(r.Message)
	s.reply(id, r, nil, counted)
}

// reply queues a reply and starts a write unless one is in progress or the loop will write
// at the end of its turn. counted says whether it ends a request in flight; keep is a buffer
// the reply's rows live in (pooled: getRowBuf), kept until the write is done, then put back.
// Any goroutine may call it.
func (s *session) reply(id uint64, m sgio.Message, keep *[]byte, counted bool) {
	s.replyThen(id, m, keep, counted, false, 0)
}

// replyThen is reply; closeAfter closes the connection once the reply is written (set with
// the reply, under one lock, so no other write's completion can close first); release gives
// back a reservation of reserveRoom under the same lock as the reply is queued, so the reply's
// bytes are never counted twice.
func (s *session) replyThen(id uint64, m sgio.Message, keep *[]byte, counted, closeAfter bool, release int64) {
	s.mu.Lock()
	if closeAfter {
		s.closeAfterWrite = true
	}
	if release != 0 {
		s.reserved -= release
		s.signalRoomLocked()
	}
	if s.isClosed {
		s.mu.Unlock()
		if keep != nil {
			putRowBuf(keep)
		}
		if counted {
			s.endRequests(1)
		}
		return
	}
	s.pending.Append(id, m)
	if held := s.pending.Len() + s.sending.Len() + s.reserved; held > s.heldPeak {
		s.heldPeak = held
	}
	if counted {
		s.pendingCounted++
	}
	if keep != nil {
		s.pendingKeep = append(s.pendingKeep, keep)
	}
	if s.busy || s.inLoop {
		s.mu.Unlock()
		return
	}
	bufs, counted2 := s.takePendingLocked()
	s.asyncCounted = counted2 // one write at a time (busy): asyncWriteDone takes it
	err := s.tr.writeAsync(bufs, s.asyncDoneFn)
	if err != nil {
		s.asyncCounted = 0
	}
	s.mu.Unlock()
	if err != nil {
		s.writeDone(counted2, err, false)
	}
}

// asyncWriteDone is writeAsync's callback, on the loop: it ends the write in progress with
// the requests its replies answered.
func (s *session) asyncWriteDone(err error) {
	s.mu.Lock()
	counted := s.asyncCounted
	s.asyncCounted = 0
	s.mu.Unlock()
	s.writeDone(counted, err, true)
}

// takePendingLocked moves pending to sending and marks a write in progress. Caller holds mu.
func (s *session) takePendingLocked() (bufs [][]byte, counted int) {
	s.busy = true
	s.pending, s.sending = s.sending, s.pending
	s.pendingKeep, s.sendingKeep = s.sendingKeep, s.pendingKeep
	counted, s.pendingCounted = s.pendingCounted, 0
	s.srv.counters.writes.Add(1)
	s.srv.counters.bytesOut.Add(uint64(s.sending.Len()))
	return s.sending.Buffers(), counted
}

// writeDone ends the write in progress: its replies' requests are answered. onLoop says the
// caller is the connection's loop, which then writes what has piled up meanwhile.
func (s *session) writeDone(counted int, err error, onLoop bool) {
	s.mu.Lock()
	s.sending.Reset()
	for _, b := range s.sendingKeep {
		putRowBuf(b) // written or copied: nothing references it now
	}
	clear(s.sendingKeep)
	s.sendingKeep = s.sendingKeep[:0]
	s.busy = false
	s.endRequests(counted)
	wake := s.wantWake && !s.isClosed
	s.wantWake = false
	s.signalRoomLocked()
	if wake {
		s.tr.wake()
	}
	if err == nil && s.closeAfterWrite && s.pending.Len() == 0 && !s.isClosed {
		s.markClosedLocked()
		s.tr.close()
		s.mu.Unlock()
		return
	}
	if err != nil && !s.isClosed {
		s.markClosedLocked()
		s.tr.close()
		s.mu.Unlock()
		s.logger().Info("storenode: closing connection: write failed", "err", err)
		return
	}
	s.mu.Unlock()
	if onLoop {
		s.flushLoop()
	}
}

// flushLoop writes the pending replies, synchronously, on the loop; a write in progress will
// write them when it is done instead.
func (s *session) flushLoop() {
	for {
		s.mu.Lock()
		if s.busy || s.isClosed || s.pending.Len() == 0 {
			s.mu.Unlock()
			return
		}
		bufs, counted := s.takePendingLocked()
		s.mu.Unlock()
		err := s.tr.writeLoop(bufs)
		if err == errWriteLater {
			// Sliced (gnet, server_gnet.go): asyncWriteDone ends it on the loop, later.
			s.mu.Lock()
			s.asyncCounted = counted
			s.mu.Unlock()
			return
		}
		s.writeDone(counted, err, false)
		if err != nil {
			return
		}
	}
}
