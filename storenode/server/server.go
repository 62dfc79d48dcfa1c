// Package server puts a storage engine (package storenode) on the network: Server and Serve,
// so binaries (cmd/storenode) stay thin. It is the only package of the storage node that links
// a network stack (gnet and its dependencies); txnode, storenode and sgio do not (a CI check).
// It reaches the engine through its exported methods only: the public API, and the few that
// serve a server (storenode's serving.go: ReadCached, the reply-size bounds, RowBytes, Now,
// Failure). docs/operations.md describes how to run it, docs/wire.md the protocol it speaks.
//
// # Layout
//
//	server.go             Server (New, Start, Serve, Healthy, Addr, Engine)
//	config.go             Config, its defaults and checks; the server's internal bounds
//	server_shutdown.go    Shutdown: drain the requests in flight, stop, checkpoint
//	stats.go              Stats, StatDescs, CommitLatency
//	public_text.go        error texts without the machine's paths (PublicText)
//	errors.go             the server's sentinels (ErrFileLimit, ErrTransportStopped)
//	limits.go             the file descriptor budget checked at start (limits_unix.go, _windows)
//	server_accept.go      the accept loop and admission (MaxConns, handshake slots, eviction)
//	server_gnet.go        the gnet transport (event loops, Writev, AsyncWritev)
//	server_tls.go         the crypto/tls transport (a reader and a writer goroutine per conn)
//	session.go            one connection's session: its state and its life, accept to close
//	session_handshake.go  Hello, Auth, the auth deadline, the claim of the owner id
//	session_dispatch.go   the requests of a turn: decoded, routed, executed (exec)
//	session_owner.go      leases renewed by traffic; the owner and holder checks
//	session_reply.go      replies: one write at a time, requests ended once written
//	session_commit.go     the commit path: bounds, pooled body copies, the commit goroutine
//	server_read.go        reads: inline from the cache on the event loop, else on a goroutine
//	server_backup.go      online backup over the wire, pulled piece by piece off the event loop
//
// # Rules
//
// docs/operations.md ("The server's internals") has them in full, with the reasons.
//
//   - Transports: gnet v2 event loops, or crypto/tls net.Conns when Config.TLS is set; both
//     run the same session code. Accept errors (EMFILE) are retried after a back-off.
//   - Handshake: Hello, HelloReply (challenge), Auth (client proof first), AuthOK; nothing
//     else is served before it; a wrong proof is answered after AuthFailDelay.
//   - The event loop never blocks on disk: it answers Ping, cached reads (ReadCached takes the
//     engine lock only if free) and lease renewals inline; everything else goes to goroutines;
//     commits go to one commit goroutine per connection, in arrival order.
//   - Readers other than a table's holder are served only durable rows.
//   - Start checks everything that needs no disk before it opens the engine.
//   - Frame bytes are valid only during the event-loop turn that decoded them: a request
//     handed off is parsed first; a Commit body is copied once into a pooled buffer.
//   - A reply's row buffer lives until the write carrying it completed; only then is the
//     Writer reset.
//   - The cached read and commit paths allocate nothing of the server's own once warm
//     (alloc_test.go); reused slices are bounded (commitSegmentsKeep, readWantsKeep,
//     readTurnKeep).
//   - Everything is bounded: frame length (checked before allocating; HandshakeBodyMax before
//     auth), MaxConns, MaxHandshakes(PerSource), MaxInflight, MaxQueuedBytes(Total),
//     turnReplyMaxBytes, connReplyMaxBytes, outboundMaxBytes, MaxOutboundBytesTotal,
//     writeSliceBytes, IOV_MAX, AuthTimeout, IdleTimeout (docs/operations.md lists each).
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"

	"github.com/panjf2000/gnet/v2"

	"github.com/weftdb/weft/internal/latency"
	"github.com/weftdb/weft/sgio"
	"github.com/weftdb/weft/storenode"
)

// Server is a storage node: an engine behind the sgio protocol. Create it with New,
// start it with Start, stop it with Shutdown; or run Serve. Its methods may be called from any
// goroutine.
type Server struct {
	cfg        Config
	log        *slog.Logger
	eng        *storenode.Engine
	ownsEngine bool
	hello      sgio.HelloReply // limits and mode; the nonce is per session
	keys       []roleKey       // the HMAC keys of the configured secrets, each with its roles (roles.go)
	clientsKey []byte          // the clients' key, which the owners' keys derive from; nil when Secret is not set
	leaseNanos int64
	adm        admission    // guarded by mu
	logLimit   logLimiter   // rate of refusal logs
	fatal      fatalFlag    // the transport stopped on its own
	queued     atomic.Int64 // request bytes (commits, waiting reads) queued on all connections
	outbound   atomic.Int64 // reply bytes in gnet's outbound buffers, as each loop last saw them (gnetTransport.observe)
	outPeak    atomic.Int64 // the most outbound has been; tests read it

	mu           sync.Mutex
	started      bool
	stopped      bool
	addr         net.Addr
	sessions     map[*session]struct{}
	gnetEng      gnet.Engine
	runDone      chan error    // gnet.Run's result
	gnetDone     chan struct{} // closed once watchGnet saw gnet.Run return
	gnetStopping atomic.Bool   // stopGnet began: gnet.Run returning is expected
	ln           net.Listener  // the accept loop's listener (gnet and TLS)
	stopAcc      chan struct{} // closed to stop the accept loop's back-off
	accDone      chan struct{} // closed when the accept loop returned
	tlsLn        net.Listener
	connWG       sync.WaitGroup // TLS accept loop and connection goroutines
	done         chan struct{}  // closed when Shutdown finished
	stopErr      error

	conns    atomic.Int64 // sessions held, rejected ones included
	requests inflightTracker
	workers  sync.WaitGroup // goroutines that call the engine for requests
	rowBytes sync.Map       // table id -> row size (ids are never reused)
	counters serverCounters
	// commitLatency records each acknowledged Commit's time from its arrival on the event
	// loop to its acknowledgement (CommitLatency).
	commitLatency latency.Histogram
	closeHook     func(*session) // tests: runs after a session's connection closed
}

// New checks cfg and returns a server that is not yet listening. It opens nothing:
// Start does.
func New(cfg Config) (*Server, error) {
	cfg = cfg.withDefaults()
	if err := cfg.checkListen(); err != nil {
		return nil, err
	}
	keys, err := roleKeys(&cfg)
	if err != nil {
		return nil, err
	}
	s := &Server{
		cfg:        cfg,
		keys:       keys,
		clientsKey: clientsKey(keys),
		log:        cfg.Logger,
		eng:        cfg.Engine,
		sessions:   make(map[*session]struct{}),
		done:       make(chan struct{}),
	}
	if s.eng != nil {
		s.configure()
	}
	return s, nil
}

// configure derives the HelloReply template from the engine.
func (s *Server) configure() {
	mode := sgio.SyncAlways
	if s.eng.SyncMode() == storenode.SyncNone {
		mode = sgio.SyncNone
	}
	lease := s.eng.LeaseDuration()
	s.leaseNanos = int64(lease)
	s.hello = sgio.HelloReply{
		Version:     sgio.Version,
		SyncMode:    mode,
		MaxBody:     s.cfg.MaxBody,
		MaxInflight: uint32(s.cfg.MaxInflight),
		LeaseMillis: uint32(min(lease.Milliseconds(), 1<<32-1)),
	}
}

// Start binds the listen address, opens the engine (unless Config.Engine was given)
// and starts serving. It returns once connections are accepted; Addr then reports the
// address. On failure nothing is left open.
//
// Everything that can fail without the disk is checked before the engine is opened, so a
// start that fails for such a reason leaves the store's directory as it was (not created
// when it did not exist): the listen address (in use, refused), the descriptors that
// MaxConns and the event loops need (ErrFileLimit), the network engine's boot. (New
// has checked the configuration and the secret.) Only then is the engine opened, which
// creates the directory and its files, and the file limit checked again with its tables.
// Connections that arrive while the engine recovers wait in the listener's backlog.
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started {
		return errors.New("storenode: server already started")
	}
	s.started = true
	ln, booted, err := s.prepareListen()
	if err == nil && s.eng == nil {
		var e *storenode.Engine
		if e, err = storenode.Open(s.cfg.Options); err == nil {
			s.eng, s.ownsEngine = e, true
			s.configure()
		}
	}
	if err == nil {
		err = s.checkFileLimit(s.eng)
	}
	if err == nil && s.cfg.TLS != nil {
		s.startTLS(ln)
	} else if err == nil {
		s.serveGnet(ln)
	}
	if err != nil {
		if ln != nil {
			_ = ln.Close()
		}
		if booted {
			s.stopGnetEngine()
		}
		if s.ownsEngine {
			_ = s.eng.Close()
		}
		s.stopped = true
		close(s.done)
		return err
	}
	s.log.Info("storenode: listening", "addr", s.addr.String(), "tls", s.cfg.TLS != nil,
		"sync", s.eng.SyncMode().String(), "max_conns", s.cfg.MaxConns, "max_inflight", s.cfg.MaxInflight,
		"max_body", s.cfg.MaxBody, "secret", len(s.cfg.Secret) > 0,
		"peer_secret", len(s.cfg.PeerSecret) > 0, "operator_secret", len(s.cfg.OperatorSecret) > 0)
	if s.cfg.OnListen != nil {
		s.cfg.OnListen(s.addr)
	}
	return nil
}

// prepareListen does the part of Start that touches no store file: it checks the file limit
// for the connections and event loops (with the tables of Config.Engine, if given),
// binds the listen address and, without TLS, boots gnet's event loops (booted). On failure
// it has closed what it opened.
func (s *Server) prepareListen() (ln net.Listener, booted bool, err error) {
	if err := s.checkFileLimit(s.eng); err != nil {
		return nil, false, err
	}
	ln, err = net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return nil, false, fmt.Errorf("storenode: listen on %s%s: %w", s.cfg.Listen, listenHolder(s.cfg.Listen, err), err)
	}
	if s.cfg.TLS == nil {
		if err := s.bootGnet(); err != nil {
			_ = ln.Close()
			return nil, false, err
		}
		booted = true
	}
	return ln, booted, nil
}

// checkFileLimit refuses to start when the connections and the tables of e (none when e is
// nil: the check before the engine is opened) cannot have their file descriptors
// (limits.go).
func (s *Server) checkFileLimit(e *storenode.Engine) error {
	limit := s.cfg.fileLimit
	if limit == 0 {
		var err error
		if limit, err = fileLimit(); err != nil {
			return err
		}
	}
	tables := 0
	if e != nil {
		tables = e.OpenFiles()
	}
	return checkFileLimit(s.cfg.MaxConns+rejectLingerMax, s.cfg.EventLoops, tables, s.cfg.ReservedFiles, limit)
}

// Addr reports the address the server listens on, or nil before Start.
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

// Engine reports the engine the server serves (nil before Start when it opens its own).
func (s *Server) Engine() *storenode.Engine {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.eng
}

// Healthy reports nil while the server serves: started, not shutting down, its network
// transport running (ErrTransportStopped once it stopped on its own) and its engine not
// stopped by an IO failure (ErrFailStop, wrapping the cause).
func (s *Server) Healthy() error {
	s.mu.Lock()
	started, stopped, e := s.started, s.stopped, s.eng
	s.mu.Unlock()
	if err := s.fatal.get(); err != nil {
		return err
	}
	switch {
	case !started:
		return errors.New("storenode: server not started")
	case stopped || s.requests.isDraining():
		return fmt.Errorf("storenode: server is shutting down: %w", sgio.ErrShuttingDown)
	}
	return e.Failure()
}

// Failed returns a channel closed when the server's network transport stopped on its own
// (Healthy then reports why): the server no longer serves and the process should exit with
// a failure once it has shut the server down.
func (s *Server) Failed() <-chan struct{} {
	s.fatal.init()
	return s.fatal.ch
}

// Done returns a channel closed when Shutdown has finished.
func (s *Server) Done() <-chan struct{} { return s.done }

// Serve runs a storage node until ctx ends, then shuts it down gracefully within
// cfg.ShutdownTimeout: it stops accepting, finishes the batches in flight, checkpoints and
// closes the engine. It returns nil after a clean shutdown; when the transport stops on its
// own, it shuts down at once and returns an error wrapping ErrTransportStopped.
func Serve(ctx context.Context, cfg Config) error {
	s, err := New(cfg)
	if err != nil {
		return err
	}
	if err := s.Start(); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
	case <-s.Failed():
	}
	sctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
	defer cancel()
	return errors.Join(s.fatal.get(), s.Shutdown(sctx))
}

// tableRowBytes reports a table's row size. Table ids are never reused, so the answer is
// cached for good.
func (s *Server) tableRowBytes(id uint32) (int, error) {
	if v, ok := s.rowBytes.Load(id); ok {
		return v.(int), nil
	}
	n, err := s.eng.RowBytes(id)
	if err != nil {
		return 0, err
	}
	s.rowBytes.Store(id, n)
	return n, nil
}
