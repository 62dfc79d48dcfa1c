package server

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/weftdb/weft/sgio"
)

// The handshake of a session: Hello, HelloReply (the challenge), Auth (the client's proof),
// AuthOK; its deadline (AuthTimeout), the delayed answer to a wrong proof (AuthFailDelay) and
// the claim of the owner id once the client is authenticated.

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
