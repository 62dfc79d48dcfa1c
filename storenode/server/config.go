package server

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"strconv"
	"time"

	"github.com/weftdb/weft/sgio"
	"github.com/weftdb/weft/storenode"
)

// A server's configuration: Config, its defaults and the checks New makes of it before
// anything is opened.

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
	// Secret is the clients' secret (game servers, transaction nodes) for the handshake's
	// mutual HMAC-SHA256 proofs: hex or base64 of at least sgio.SecretBytesMin random bytes
	// (sgio.ParseSecret; New refuses anything else with sgio.ErrWeakSecret). Empty: loopback
	// only. docs/operations.md, "Roles and credentials".
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

	// MaxConns bounds the connections held at once. 0 or negative: DefaultMaxConns (1024).
	// Start refuses to run (ErrFileLimit) when MaxConns, the tables and a margin exceed
	// RLIMIT_NOFILE.
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
	// MaxInflight bounds the requests in flight per connection, at most sgio.MaxInflightLimit;
	// announced in HelloReply, a request beyond it is answered with ErrBusy. 0 or negative:
	// DefaultMaxInflight (1024).
	MaxInflight int
	// MaxBody is the largest request body accepted, in bytes, announced in HelloReply; New
	// refuses more than sgio.MaxBodyLimit. 0: DefaultMaxBody (16 MiB).
	MaxBody uint32
	// AuthTimeout bounds the time from connecting to a completed handshake, not extended by
	// traffic (a client that sends one byte a second is closed at the deadline all the same).
	// 0 or negative: DefaultAuthTimeout (10 s).
	AuthTimeout time.Duration
	// IdleTimeout closes a session that sent nothing and had nothing in flight for this long.
	// 0: DefaultIdleTimeout (5 min); negative disables it.
	IdleTimeout time.Duration
	// WriteTimeout bounds one write to a TLS connection, and the time a sliced write to a
	// gnet connection (writeSliceBytes) moves not at all: then the connection is closed.
	// 0 or negative: DefaultWriteTimeout (10 s).
	WriteTimeout time.Duration
	// EventLoops is the number of gnet event loops; GOMAXPROCS when zero or negative.
	EventLoops int

	// MaxHandshakes bounds the connections still in the handshake (DefaultMaxHandshakes, at
	// most MaxConns/2); MaxHandshakesPerSource those of one source address
	// (DefaultMaxHandshakesPerSource). A connection over either evicts the oldest
	// handshaking connection (server_accept.go).
	MaxHandshakes, MaxHandshakesPerSource int
	// AuthFailDelay delays the answer (and the close) to a wrong proof; failed attempts are
	// delayed, never locked out. 0 or negative: DefaultAuthFailDelay (1 s).
	AuthFailDelay time.Duration
	// MaxQueuedBytes bounds the request bodies one connection has queued (Commits not yet
	// submitted, reads waiting for their goroutine), MaxQueuedBytesTotal those of all; a request
	// over either gets ErrBusy before its body is copied or parsed. 0 or negative:
	// DefaultMaxQueuedBytes (64 MiB), DefaultMaxQueuedBytesTotal (512 MiB).
	MaxQueuedBytes, MaxQueuedBytesTotal int64
	// MaxOutboundBytesTotal bounds the reply bytes not yet taken by their clients, over all
	// gnet connections (not TLS): over it, a connection with replies of its own unwritten is
	// not read until they drain. 0 or negative: DefaultMaxOutboundBytesTotal (512 MiB).
	// docs/operations.md, "Limits against hostile and broken clients".
	MaxOutboundBytesTotal int64

	// Logger receives connection and lifecycle events; Options.Logger, else slog.Default().
	Logger *slog.Logger
	// OnListen, when set, is called once with the address the server listens on, before
	// Start returns (Serve's way of telling a port-0 address).
	OnListen func(addr net.Addr)
	// ShutdownTimeout bounds Serve's graceful shutdown. 0 or negative:
	// DefaultShutdownTimeout (30 s).
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
