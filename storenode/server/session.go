package server

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/sgio"
	"github.com/weftdb/weft/storenode"
)

// One connection's session: its state, its transport, and its life from accept to close
// (idleness, a failed write, the peer's close). The handshake, the requests and the replies
// are in session_handshake.go, session_dispatch.go and session_reply.go.

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
	commitBatch base.Batch
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

// endRequests ends k in-flight requests.
func (s *session) endRequests(k int) {
	if k > 0 {
		s.inflight.Add(int64(-k))
		s.srv.requests.end(k)
	}
}
