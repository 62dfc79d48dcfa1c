// Package server puts a storage engine (package storenode) on the network: Server and Serve,
// so binaries (cmd/storenode) stay thin. It is the only package of the storage node that links
// a network stack (gnet and its dependencies); txnode, storenode and sgio do not (a CI check).
// It reaches the engine through its exported methods only: the public API, and the few that
// serve a server (storenode's serving.go: ReadCached, the reply-size bounds, RowBytes, Now,
// Failure). docs/operations.md describes how to run it, docs/wire.md the protocol it speaks.
//
// # Layout
//
//	server.go          Config, Server (New, Start, Shutdown, Serve, Healthy), Stats, StatDescs
//	errors.go          the server's sentinels (ErrFileLimit, ErrTransportStopped)
//	limits.go          the file descriptor budget checked at start (limits_unix.go, _windows)
//	server_accept.go   the accept loop and admission (MaxConns, handshake slots, eviction)
//	server_gnet.go     the gnet transport (event loops, Writev, AsyncWritev)
//	server_tls.go      the crypto/tls transport (a reader and a writer goroutine per conn)
//	session.go         one connection's protocol state: handshake, requests, replies
//	session_commit.go  the commit path: bounds, pooled body copies, the commit goroutine
//	server_read.go     reads: inline from the cache on the event loop, else on a goroutine
//	server_backup.go   online backup over the wire, pulled piece by piece off the event loop
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
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/panjf2000/gnet/v2"

	"github.com/weftdb/weft/internal/latency"
	"github.com/weftdb/weft/sgio"
	"github.com/weftdb/weft/storenode"
)

// Defaults of Config, applied where a field is zero.
const (
	// DefaultListen is the storage node's default address: loopback only.
	DefaultListen = "127.0.0.1:7070"
	// DefaultMaxConns bounds the connections a server holds at once.
	DefaultMaxConns = 1024
	// DefaultMaxInflight bounds the requests in flight on one connection.
	DefaultMaxInflight = 1024
	// DefaultMaxBody is the largest request body the server accepts.
	DefaultMaxBody = 16 << 20
	// DefaultAuthTimeout bounds the time from connecting to a completed handshake.
	DefaultAuthTimeout = 10 * time.Second
	// DefaultIdleTimeout closes a session that sent nothing and had nothing in flight this
	// long.
	DefaultIdleTimeout = 5 * time.Minute
	// DefaultWriteTimeout bounds one write to a TLS connection, and the time a sliced write
	// to a gnet connection may take nothing (writeSliceBytes).
	DefaultWriteTimeout = 10 * time.Second
	// DefaultShutdownTimeout bounds Serve's graceful shutdown.
	DefaultShutdownTimeout = 30 * time.Second
	// DefaultMaxHandshakes bounds the connections in the handshake at once (at most half of
	// MaxConns when MaxConns is smaller).
	DefaultMaxHandshakes = 128
	// DefaultMaxHandshakesPerSource bounds one source address's connections in the
	// handshake.
	DefaultMaxHandshakesPerSource = 32
	// DefaultAuthFailDelay delays the answer to a wrong proof.
	DefaultAuthFailDelay = time.Second
	// DefaultMaxQueuedBytes bounds the request bytes (commits, waiting reads) queued on one
	// connection.
	DefaultMaxQueuedBytes = 64 << 20
	// DefaultMaxQueuedBytesTotal bounds the request bytes queued on all connections.
	DefaultMaxQueuedBytesTotal = 512 << 20
	// DefaultMaxOutboundBytesTotal bounds the replies waiting in gnet's outbound buffers on
	// all connections: without it MaxConns connections could hold outboundMaxBytes each
	// (64 GiB at the defaults).
	DefaultMaxOutboundBytesTotal = 512 << 20

	// minReplyBody is the smallest reply body limit a client may announce in Hello: every
	// Error reply fits.
	minReplyBody = 2 * sgio.ErrorMessageMax
	// rejectLingerMax bounds the connections kept open past MaxConns only to be told why they
	// are refused; beyond it, a connection is closed at once.
	rejectLingerMax = 64
	// outboundMaxBytes bounds what a connection may have queued in gnet's outbound buffer: a
	// client that does not read its replies is closed.
	outboundMaxBytes = 64 << 20
	// turnReplyMaxBytes bounds the replies one event-loop turn holds: a turn that reaches it
	// writes them and takes the rest of its inbound bytes in another turn.
	turnReplyMaxBytes = 4 << 20
	// connReplyMaxBytes bounds the replies a connection holds (produced, not yet handed to
	// the transport) before its read goroutine waits for a write to finish.
	connReplyMaxBytes = 16 << 20
	// outboundRecheck is how often a connection with replies waiting in its outbound buffer
	// looks at it again (gnet tells nobody when one drains): for the server-wide count
	// (MaxOutboundBytesTotal) and to read again a connection the budget stopped. While the
	// buffer does not move the interval doubles, up to outboundRecheckMax.
	outboundRecheck = 2 * time.Millisecond
	// writeSliceBytes bounds what one wake-up of an event loop hands to gnet of one
	// connection's write: a larger write goes out a slice per wake-up, the loop's other
	// connections served between slices, the next slice once gnet's outbound buffer holds
	// less than writeLowWater (server_gnet.go).
	writeSliceBytes    = 256 << 10
	writeLowWater      = 1 << 20
	outboundRecheckMax = 64 * time.Millisecond
	// stoppedInboundMaxBytes bounds the request bytes gnet buffers for a connection that
	// MaxOutboundBytesTotal stopped (gnet reads its socket all the same): past it the
	// connection is read again, so a client that sends without reading meets its own
	// bound (outboundMaxBytes) instead of growing the buffer without end.
	stoppedInboundMaxBytes = 16 << 20
)

// Config configures a Server. The zero value of a field means its default.
type Config struct {
	// Engine is an open engine to serve. It stays the caller's: Shutdown checkpoints it but
	// does not close it. When nil, Start opens one with Options and Shutdown closes it.
	Engine *storenode.Engine
	// Options opens the engine when Engine is nil (Dir, Sync, CacheBytes, checkpoint
	// triggers, LeaseDuration, Now...).
	Options storenode.Options

	// Listen is the TCP address, host:port; DefaultListen when empty. A port of 0 picks a
	// free one (Addr reports it). A non-loopback address is refused unless Secret is set.
	Listen string
	// Advertise is the address the cluster names this storage node by (the partition map's
	// entries in etcd: what game servers give CreateTable), against which move steps and
	// clients' cluster table creations are verified; "" is the address it listens on, which
	// must then be a specific one (a node listening on 0.0.0.0 or [::] needs Advertise).
	Advertise string
	// Secret is the shared secret of the handshake's mutual HMAC-SHA256 proofs, as
	// configured: hex or base64 of at least sgio.SecretBytesMin random bytes (sgio.ParseSecret;
	// New refuses anything else with sgio.ErrWeakSecret). Empty is allowed on loopback
	// only: the proofs then only show that both sides speak Weft. It is the clients' secret
	// (game servers, transaction nodes): docs/operations.md, "Roles and credentials".
	Secret []byte
	// PeerSecret is the secret of the cluster's other storage nodes (their resolvers' Ask
	// and Report), in Secret's format. Empty: no peer is accepted, unless no secret at all
	// is configured (loopback: every caller has every role).
	PeerSecret []byte
	// OperatorSecret is the secret of operators (the weft CLI, the mover, cluster
	// tooling: backups, moves, drops of other owners' tables), in Secret's format. Empty: no
	// operator is accepted, unless no secret at all is configured. The three secrets must
	// differ (New refuses duplicates with ErrRoleSecrets).
	OperatorSecret []byte
	// TLS, when set, serves over crypto/tls (net.Conn per connection) instead of gnet.
	TLS *tls.Config

	// MaxConns bounds the connections held at once (DefaultMaxConns). Start refuses to run
	// (ErrFileLimit) when MaxConns, the tables and a margin exceed RLIMIT_NOFILE.
	MaxConns int
	// ReservedFiles is the file descriptors the embedding process holds beside the server's
	// (the storenode binary's metrics listener and its connections, at most
	// metricsConnsMax+1): counted in Start's check against RLIMIT_NOFILE (limits.go).
	ReservedFiles int
	// fileLimit replaces RLIMIT_NOFILE in the start-up check (tests).
	fileLimit uint64
	// readHook, when set, runs on a read's goroutine before it builds each reply off the
	// event loop (tests).
	readHook func(sgio.Message)
	// writeHook, when set, runs on the event loop after each writev of a gnet connection,
	// with the session's owner, the bytes it handed to gnet, those of the write left to hand
	// (a sliced write: writeSliceBytes) and the time it took (tests).
	writeHook func(owner uint64, n, left int, took time.Duration)
	// MaxInflight bounds the requests in flight per connection (DefaultMaxInflight); it is
	// announced in HelloReply, and a request beyond it is answered with ErrBusy.
	MaxInflight int
	// MaxBody is the largest request body accepted, at most sgio.MaxBodyLimit
	// (DefaultMaxBody); announced in HelloReply.
	MaxBody uint32
	// AuthTimeout bounds the time from connecting to a completed handshake
	// (DefaultAuthTimeout). It is not extended by traffic: a client that sends one byte a
	// second is closed at the deadline all the same.
	AuthTimeout time.Duration
	// IdleTimeout closes a session that sent nothing and had nothing in flight for this long
	// (DefaultIdleTimeout); negative disables it.
	IdleTimeout time.Duration
	// WriteTimeout bounds one write to a TLS connection, and the time a sliced write to a
	// gnet connection (writeSliceBytes) moves not at all: then the connection is closed
	// (DefaultWriteTimeout).
	WriteTimeout time.Duration
	// EventLoops is the number of gnet event loops; GOMAXPROCS when zero.
	EventLoops int

	// MaxHandshakes bounds the connections still in the handshake (DefaultMaxHandshakes, at
	// most MaxConns/2); MaxHandshakesPerSource those of one source address
	// (DefaultMaxHandshakesPerSource). A connection over either evicts the oldest
	// handshaking connection (server_accept.go).
	MaxHandshakes, MaxHandshakesPerSource int
	// AuthFailDelay delays the answer (and the close) to a wrong proof (DefaultAuthFailDelay);
	// failed attempts are delayed, never locked out.
	AuthFailDelay time.Duration
	// MaxQueuedBytes bounds the request bodies a connection has queued: its Commits not yet
	// submitted to the engine and its reads (ReadPages, PageDir) waiting for their goroutine
	// (DefaultMaxQueuedBytes); MaxQueuedBytesTotal bounds them on all connections
	// (DefaultMaxQueuedBytesTotal). A request over either is answered with ErrBusy before
	// its body is copied or parsed.
	MaxQueuedBytes, MaxQueuedBytesTotal int64
	// MaxOutboundBytesTotal bounds the replies written but not yet taken by their clients
	// (gnet's outbound buffers, the rest of sliced writes) on all connections (DefaultMaxOutboundBytesTotal). Over it, a
	// connection with replies of its own still unwritten stops being read until they drain
	// (checked every outboundRecheck); one whose output has drained is read on. Each
	// connection is also bounded on its own (outboundMaxBytes: a client that lets more pile
	// up is closed). Not for TLS, whose writes block the connection's own writer goroutine.
	MaxOutboundBytesTotal int64

	// Logger receives connection and lifecycle events; Options.Logger, else slog.Default().
	Logger *slog.Logger
	// OnListen, when set, is called once with the address the server listens on, before
	// Start returns (Serve's way of telling a port-0 address).
	OnListen func(addr net.Addr)
	// ShutdownTimeout bounds Serve's graceful shutdown (DefaultShutdownTimeout).
	ShutdownTimeout time.Duration
}

func (c Config) withDefaults() Config {
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.MaxConns <= 0 {
		c.MaxConns = DefaultMaxConns
	}
	if c.MaxInflight <= 0 {
		c.MaxInflight = DefaultMaxInflight
	}
	c.MaxInflight = min(c.MaxInflight, sgio.MaxInflightLimit)
	if c.MaxBody == 0 {
		c.MaxBody = DefaultMaxBody
	}
	if c.AuthTimeout <= 0 {
		c.AuthTimeout = DefaultAuthTimeout
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.WriteTimeout <= 0 {
		c.WriteTimeout = DefaultWriteTimeout
	}
	if c.EventLoops <= 0 {
		c.EventLoops = runtime.GOMAXPROCS(0)
	}
	if c.ShutdownTimeout <= 0 {
		c.ShutdownTimeout = DefaultShutdownTimeout
	}
	if c.MaxHandshakes <= 0 {
		c.MaxHandshakes = min(DefaultMaxHandshakes, max(c.MaxConns/2, 1))
	}
	if c.MaxHandshakesPerSource <= 0 {
		c.MaxHandshakesPerSource = DefaultMaxHandshakesPerSource
	}
	if c.AuthFailDelay <= 0 {
		c.AuthFailDelay = DefaultAuthFailDelay
	}
	if c.MaxQueuedBytes <= 0 {
		c.MaxQueuedBytes = DefaultMaxQueuedBytes
	}
	if c.MaxQueuedBytesTotal <= 0 {
		c.MaxQueuedBytesTotal = DefaultMaxQueuedBytesTotal
	}
	if c.MaxOutboundBytesTotal <= 0 {
		c.MaxOutboundBytesTotal = DefaultMaxOutboundBytesTotal
	}
	if c.Logger == nil {
		c.Logger = c.Options.Logger
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// checkListen refuses a non-loopback address without a secret.
func (c Config) checkListen() error {
	host, port, err := net.SplitHostPort(c.Listen)
	if err != nil {
		return fmt.Errorf("storenode: listen address %q: %w", c.Listen, err)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("storenode: listen address %q: bad port", c.Listen)
	}
	if c.MaxBody > sgio.MaxBodyLimit {
		return fmt.Errorf("storenode: MaxBody %d above the protocol's %d", c.MaxBody, sgio.MaxBodyLimit)
	}
	if len(bytes.TrimSpace(c.Secret)) == 0 && !IsLoopback(host) {
		return fmt.Errorf("storenode: refusing to listen on non-loopback address %q without a secret "+
			"(configure one, and TLS across an untrusted network)", c.Listen)
	}
	return nil
}

// IsLoopback reports whether host (an IP literal or "localhost") names only the loopback
// interface. An empty host, a wildcard address or any other name is not loopback.
func IsLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

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

// Shutdown stops the server gracefully: it stops taking connections and requests (both are
// answered with ErrShuttingDown), waits for the requests in flight to be answered (commits
// included: every batch it accepted is durable or failed, and its reply written), closes the
// connections, then checkpoints and closes the engine (or only checkpoints an engine given in
// Config.Engine). When ctx ends first, connections are closed with requests still in
// flight and the engine is closed at once; the error then wraps ctx's. Shutdown is
// idempotent: later calls wait for the first and return its result.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	if s.stopped || !s.started {
		first := !s.started && !s.stopped
		s.stopped = true
		s.mu.Unlock()
		if first {
			close(s.done)
			return nil
		}
		<-s.done
		return s.stopErr
	}
	s.stopped = true
	s.mu.Unlock()

	start := time.Now()
	s.log.Info("storenode: shutting down", "requests_in_flight", s.requests.count())
	drainErr := s.requests.drain(ctx)
	if drainErr != nil {
		s.log.Warn("storenode: shutdown deadline: closing connections with requests in flight",
			"requests_in_flight", s.requests.count(), "err", drainErr)
	}
	s.stopTransport()
	var err error
	if drainErr == nil {
		s.workers.Wait()
		if s.ownsEngine {
			err = s.eng.Close()
		} else {
			err = s.eng.Checkpoint()
		}
	} else {
		// Wake commits that wait (for a seq gap, for cache room) before waiting for them.
		if s.ownsEngine {
			err = s.eng.Close()
		}
		s.workers.Wait()
		err = errors.Join(fmt.Errorf("storenode: shutdown: %w", drainErr), err)
	}
	if err != nil {
		s.log.Error("storenode: shutdown", "err", err)
	} else {
		s.log.Info("storenode: stopped", "took", time.Since(start))
	}
	s.stopErr = err
	close(s.done)
	return err
}

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

// Stats are a server's counters, beside its engine's Stats.
type Stats struct {
	// Conns is the number of connections open now; ConnsAccepted those accepted since Start;
	// ConnsRejected those refused (over MaxConns, or while shutting down).
	Conns, ConnsAccepted, ConnsRejected uint64
	// AuthFailures counts wrong proofs and requests before authentication; AuthTimeouts
	// connections closed at the auth deadline; IdleCloses sessions closed for idleness.
	AuthFailures, AuthTimeouts, IdleCloses uint64
	// RejectedFrames counts frames that broke the protocol (bad magic, checksum, length,
	// version, unknown type, malformed body); BusyReplies requests refused with ErrBusy.
	RejectedFrames, BusyReplies uint64
	// ForbiddenRequests counts requests refused with ErrForbidden: outside the role of the
	// caller's secret (roles.go).
	ForbiddenRequests uint64
	// Requests counts requests received; Writes the writes (writev calls) that carried their
	// replies; BytesIn and BytesOut the frame bytes received and sent.
	Requests, Writes, BytesIn, BytesOut uint64
	// InFlight is the number of requests received and not yet answered.
	InFlight int64
	// Handshaking and Authenticated are the connections in the handshake and the
	// authenticated sessions now; Evictions the handshaking connections closed to make room;
	// AcceptErrors the failed accepts (EMFILE...), each retried after a back-off.
	Handshaking, Authenticated, Evictions, AcceptErrors uint64
	// QueuedBytes is the request bytes (commits, waiting reads) queued on all connections now.
	QueuedBytes int64
	// OutboundBytes is the reply bytes written but not yet taken by their clients (gnet's
	// outbound buffers) on all connections, as last seen; OutboundPauses counts the turns in
	// which a connection was not read because it was over MaxOutboundBytesTotal.
	OutboundBytes  int64
	OutboundPauses uint64
}

type serverCounters struct {
	accepted, rejected          atomic.Uint64
	authFailures, authTimeouts  atomic.Uint64
	idleCloses                  atomic.Uint64
	rejectedFrames, busyReplies atomic.Uint64
	forbiddenRequests           atomic.Uint64
	requests, writes            atomic.Uint64
	bytesIn, bytesOut           atomic.Uint64
	evictions, acceptErrors     atomic.Uint64
	outboundPauses              atomic.Uint64
}

// CommitLatency returns the histogram of acknowledged Commits' times, from a request's
// arrival on the event loop to its acknowledgement (the engine's group commit and WAL sync
// included). Any goroutine.
func (s *Server) CommitLatency() latency.Snapshot { return s.commitLatency.Snapshot() }

// Stats reports the server's counters.
func (s *Server) Stats() Stats {
	c := &s.counters
	hs, au := s.admissionStats()
	return Stats{
		Conns:             uint64(max(s.conns.Load(), 0)),
		ConnsAccepted:     c.accepted.Load(),
		ConnsRejected:     c.rejected.Load(),
		AuthFailures:      c.authFailures.Load(),
		AuthTimeouts:      c.authTimeouts.Load(),
		IdleCloses:        c.idleCloses.Load(),
		RejectedFrames:    c.rejectedFrames.Load(),
		BusyReplies:       c.busyReplies.Load(),
		ForbiddenRequests: c.forbiddenRequests.Load(),
		Requests:          c.requests.Load(),
		Writes:            c.writes.Load(),
		BytesIn:           c.bytesIn.Load(),
		BytesOut:          c.bytesOut.Load(),
		InFlight:          s.requests.count(),
		Handshaking:       uint64(hs),
		Authenticated:     uint64(au),
		Evictions:         c.evictions.Load(),
		AcceptErrors:      c.acceptErrors.Load(),
		QueuedBytes:       s.queued.Load(),
		OutboundBytes:     s.outbound.Load(),
		OutboundPauses:    c.outboundPauses.Load(),
	}
}

// statsReply is the StatsReply of a Stats request: the engine's stats, then the server's, in
// their tables' order (storenode.StatDescs, StatDescs).
func (s *Server) statsReply() *sgio.StatsReply {
	es := s.eng.Stats()
	ss := s.Stats()
	descs := StatDescs()
	stats := make([]sgio.Stat, 0, len(storenode.StatDescs())+len(descs))
	stats = storenode.AppendStats(stats, storenode.StatDescs(), &es)
	return &sgio.StatsReply{Stats: storenode.AppendStats(stats, descs, &ss)}
}

// StatDescs returns the server's stats (its Stats), in the order they are listed and sent,
// after the engine's (storenode.StatDescs). The slice is shared: callers must not modify it.
func StatDescs() []storenode.StatDesc[Stats] { return serverStatDescs }

func nonNegative(v int64) uint64 { return uint64(max(v, 0)) }

var serverStatDescs = []storenode.StatDesc[Stats]{
	{Name: "connections", Help: "Connections open now.", Kind: storenode.StatGauge,
		Value: func(s *Stats) uint64 { return s.Conns }},
	{Name: "connections_accepted", Help: "Connections accepted.", Kind: storenode.StatCounter,
		Value: func(s *Stats) uint64 { return s.ConnsAccepted }},
	{Name: "connections_rejected", Help: "Connections refused: over --max-conns, or during shutdown.", Kind: storenode.StatCounter,
		Value: func(s *Stats) uint64 { return s.ConnsRejected }},
	{Name: "auth_failures", Help: "Handshakes failed: wrong secret, or requests before authentication.", Kind: storenode.StatCounter,
		Value: func(s *Stats) uint64 { return s.AuthFailures }},
	{Name: "auth_timeouts", Help: "Connections closed for not authenticating within --auth-timeout.", Kind: storenode.StatCounter,
		Value: func(s *Stats) uint64 { return s.AuthTimeouts }},
	{Name: "idle_closes", Help: "Sessions closed after --idle-timeout without traffic.", Kind: storenode.StatCounter,
		Value: func(s *Stats) uint64 { return s.IdleCloses }},
	{Name: "rejected_frames", Help: "Frames that broke the protocol (bad magic, checksum, length, type or body).", Kind: storenode.StatCounter,
		Value: func(s *Stats) uint64 { return s.RejectedFrames }},
	{Name: "busy_replies", Help: "Requests refused with ErrBusy: over --max-inflight or the queued-bytes bounds.", Kind: storenode.StatCounter,
		Value: func(s *Stats) uint64 { return s.BusyReplies }},
	{Name: "forbidden_requests", Help: "Requests refused with ErrForbidden: outside the role of the caller's secret (client, peer, operator).", Kind: storenode.StatCounter,
		Value: func(s *Stats) uint64 { return s.ForbiddenRequests }},
	{Name: "requests", Help: "Requests received after authentication.", Kind: storenode.StatCounter,
		Value: func(s *Stats) uint64 { return s.Requests }},
	{Name: "requests_in_flight", Help: "Requests received and not yet answered.", Kind: storenode.StatGauge,
		Value: func(s *Stats) uint64 { return nonNegative(s.InFlight) }},
	{Name: "reply_writes", Help: "Writes (writev calls) carrying replies; requests_total / reply_writes_total is the batching factor.", Kind: storenode.StatCounter,
		Value: func(s *Stats) uint64 { return s.Writes }},
	{Name: "received_bytes", Help: "Frame bytes received.", Kind: storenode.StatCounter,
		Value: func(s *Stats) uint64 { return s.BytesIn }},
	{Name: "sent_bytes", Help: "Frame bytes sent.", Kind: storenode.StatCounter,
		Value: func(s *Stats) uint64 { return s.BytesOut }},
	{Name: "connections_handshaking", Help: "Connections in the handshake now (bounded by --max-handshakes).", Kind: storenode.StatGauge,
		Value: func(s *Stats) uint64 { return s.Handshaking }},
	{Name: "sessions_authenticated", Help: "Authenticated sessions now.", Kind: storenode.StatGauge,
		Value: func(s *Stats) uint64 { return s.Authenticated }},
	{Name: "handshake_evictions", Help: "Handshaking connections closed to make room for newer ones.", Kind: storenode.StatCounter,
		Value: func(s *Stats) uint64 { return s.Evictions }},
	{Name: "accept_errors", Help: "Failed accepts (EMFILE...), each retried after a back-off.", Kind: storenode.StatCounter,
		Value: func(s *Stats) uint64 { return s.AcceptErrors }},
	{Name: "commit_queued_bytes", Help: "Request bytes queued on all connections: commits for the engine, reads for their goroutine (bounded by --max-queued-bytes-total).", Kind: storenode.StatGauge,
		Value: func(s *Stats) uint64 { return nonNegative(s.QueuedBytes) }},
	{Name: "outbound_bytes", Help: "Reply bytes written but not yet taken by their clients, on all connections (bounded by MaxOutboundBytesTotal, then what replies in flight add).", Kind: storenode.StatGauge,
		Value: func(s *Stats) uint64 { return nonNegative(s.OutboundBytes) }},
	{Name: "outbound_pauses", Help: "Event-loop turns in which a connection was not read because the replies waiting on all connections were over their bound.", Kind: storenode.StatCounter,
		Value: func(s *Stats) uint64 { return s.OutboundPauses }},
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

// stopTransport stops listening and closes every connection.
func (s *Server) stopTransport() {
	if s.cfg.TLS != nil {
		s.stopTLS()
		return
	}
	s.stopGnet()
}

// inflightTracker counts requests received and not yet answered across the server, so that
// Shutdown can wait for them. begin fails once draining has begun.
//
// The order of operations makes the wait exact without a lock: begin adds, then checks
// draining; drain sets draining, then checks the count; end subtracts, then checks draining.
// With sequentially consistent atomics, either drain sees a begin's count or the begin sees
// draining (and takes its count back), and whoever takes the count to zero after draining
// began signals.
type inflightTracker struct {
	n        atomic.Int64
	draining atomic.Bool
	zero     chan struct{} // cap 1: the count reached zero while draining
	once     sync.Once
}

func (t *inflightTracker) init() { t.once.Do(func() { t.zero = make(chan struct{}, 1) }) }

func (t *inflightTracker) begin() bool {
	t.n.Add(1)
	if t.draining.Load() {
		t.end(1)
		return false
	}
	return true
}

func (t *inflightTracker) end(k int) {
	if k == 0 {
		return
	}
	if t.n.Add(int64(-k)) == 0 && t.draining.Load() {
		t.init()
		select {
		case t.zero <- struct{}{}:
		default:
		}
	}
}

func (t *inflightTracker) count() int64 { return t.n.Load() }

func (t *inflightTracker) isDraining() bool { return t.draining.Load() }

// drain stops new requests and waits until none is in flight or ctx ends.
func (t *inflightTracker) drain(ctx context.Context) error {
	t.init()
	t.draining.Store(true)
	for t.n.Load() != 0 {
		select {
		case <-t.zero:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// absPath matches an absolute path in an error text: a "/" at the start or after a space,
// quote, parenthesis or "=", up to the next space, quote, colon, comma or parenthesis.
var absPath = regexp.MustCompile(`(^|[\s"'(=])(/[^\s"':,()]+)`)

// scrubPaths removes the machine's paths from an error text sent to a client: paths in the
// data directory become relative to it, any other absolute path becomes its last element.
// The server's own log keeps the full text.
// PublicText is err's text as the server tells clients and probes: paths inside the data
// directory relative to it, other absolute paths cut to their last element (an error of the
// engine names its files; /healthz may be served beyond loopback).
func (s *Server) PublicText(err error) string { return s.scrubPaths(err.Error()) }

func (s *Server) scrubPaths(msg string) string {
	if !strings.Contains(msg, "/") {
		return msg
	}
	if dir := s.dataDir(); dir != "" {
		msg = strings.ReplaceAll(msg, dir+string(filepath.Separator), "")
		msg = strings.ReplaceAll(msg, dir, ".")
	}
	return absPath.ReplaceAllStringFunc(msg, func(m string) string {
		i := strings.IndexByte(m, '/')
		return m[:i] + filepath.Base(m[i:])
	})
}

// dataDir reports the engine's directory, absolute, or "".
func (s *Server) dataDir() string {
	if s.eng == nil || s.eng.Dir() == "" {
		return ""
	}
	if abs, err := filepath.Abs(s.eng.Dir()); err == nil {
		return abs
	}
	return s.eng.Dir()
}
