package sgio

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"time"
)

// Connecting a Client: its configuration, Dial, and the handshake (Hello, then each side's
// proof of the shared secret) run before the connection's goroutines start.

// ClientConfig configures Dial.
type ClientConfig struct {
	// Addr is the storage node's host:port.
	Addr string
	// Secret is the shared secret of the handshake as configured: hex or base64 of at least
	// SecretBytesMin random bytes (ParseSecret; anything else fails Dial with ErrWeakSecret),
	// or empty for a loopback deployment without one (both sides must agree).
	Secret []byte
	// OwnerID identifies this transaction node.
	OwnerID uint64
	// Incarnation identifies this Open of the transaction node (random, the same for every
	// connection of one Open): see Hello.Incarnation.
	Incarnation [IncarnationSize]byte
	// Name names the client in the server's logs: empty or a valid name (CheckName).
	Name string
	// DialTimeout bounds dialing, TLS and the handshake together (and ctx bounds them too);
	// 0 means DefaultDialTimeout.
	DialTimeout time.Duration
	// WriteTimeout bounds one write of a batch of requests; a write that takes longer breaks
	// the connection. 0 means DefaultWriteTimeout.
	WriteTimeout time.Duration
	// MaxBody is the largest reply body this client accepts (the read buffer is HeaderSize +
	// MaxBody bytes); it is sent to the server in Hello. 0 means DefaultMaxBody; at most
	// MaxBodyLimit.
	MaxBody uint32
	// MaxInflight bounds the requests in flight on the connection: at most the server's bound
	// and MaxInflightLimit, which are also the default.
	MaxInflight int
	// TLS, when set, runs the connection over TLS; the client verifies the server per the
	// config (ServerName defaults to Addr's host).
	TLS *tls.Config

	dial func(ctx context.Context, network, addr string) (net.Conn, error) // tests wrap the conn
}

// Dial connects to a storage node, runs the handshake (Hello, the client's proof of the
// secret, then the server's) and
// starts the connection's sender and receiver goroutines. It fails with an error wrapping
// ErrAuthFailed on a wrong secret or a server proof mismatch, a RemoteError for an Error reply
// (ErrBusy, ErrBadVersion...), and one wrapping ctx's error when ctx or DialTimeout ends first.
func Dial(ctx context.Context, cfg ClientConfig) (*Client, error) {
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = DefaultDialTimeout
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = DefaultWriteTimeout
	}
	if cfg.MaxBody == 0 {
		cfg.MaxBody = DefaultMaxBody
	}
	if cfg.MaxBody > MaxBodyLimit {
		return nil, fmt.Errorf("sgio: ClientConfig.MaxBody %d above %d: %w", cfg.MaxBody, MaxBodyLimit, ErrFrameTooLarge)
	}
	if cfg.Name != "" {
		if err := CheckName(cfg.Name); err != nil {
			return nil, fmt.Errorf("sgio: ClientConfig.Name: %w", err)
		}
	}
	key, err := ParseSecret(cfg.Secret)
	if err != nil {
		return nil, fmt.Errorf("sgio: ClientConfig.Secret: %w", err)
	}
	dctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
	defer cancel()
	dial := cfg.dial
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	conn, err := dial(dctx, "tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("sgio: dial %s: %w", cfg.Addr, err)
	}
	// The handshake is bounded by dctx (its deadline and its cancellation): when dctx ends,
	// a deadline in the past fails the pending read or write, and dctx.Err() says why.
	stop := context.AfterFunc(dctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	conn, hello, br, err := handshake(dctx, conn, cfg, key)
	if !stop() || dctx.Err() != nil {
		if err == nil {
			err = dctx.Err()
		} else {
			err = fmt.Errorf("%w: %w", dctx.Err(), err)
		}
	}
	if err == nil {
		err = conn.SetDeadline(time.Time{})
	}
	if err != nil {
		_ = conn.Close()
		if len(key) == 0 && errors.Is(err, ErrAuthFailed) {
			return nil, fmt.Errorf("sgio: handshake with %s: %w (this client was given no secret: the storage node requires one; Weft's programs read it from the file --secret-file or $WEFT_SECRET_FILE names)", cfg.Addr, err)
		}
		return nil, fmt.Errorf("sgio: handshake with %s: %w", cfg.Addr, err)
	}

	inflight := min(int(hello.MaxInflight), MaxInflightLimit)
	if cfg.MaxInflight > 0 {
		inflight = min(inflight, cfg.MaxInflight)
	}
	c := &Client{
		conn:         conn,
		addr:         cfg.Addr,
		hello:        hello,
		bodyMax:      cfg.MaxBody,
		sendMax:      hello.MaxBody,
		writeTimeout: cfg.WriteTimeout,
		free:         make(chan uint32, inflight),
		wake:         make(chan struct{}, 1),
		dead:         make(chan struct{}),
		senderDone:   make(chan struct{}),
		receiverDone: make(chan struct{}),
		slots:        make([]slot, inflight),
		queue:        make([]uint32, 0, inflight),
	}
	c.bound = inflight
	if inflight < MaxInflightLimit {
		// One more slot, kept for urgent requests: a lease renewal never waits behind a
		// window full of commits and reads. The storage node does not count renewals and
		// Pings in flight (it answers them on its event loop), so the extra one never meets
		// its bound.
		c.urgentFree, c.urgentSlot = make(chan uint32, 1), uint32(inflight)
		c.urgentFree <- c.urgentSlot
		c.slots = make([]slot, inflight+1)
		c.queue = make([]uint32, 0, inflight+1)
	}
	for i := range inflight {
		c.free <- uint32(i)
	}
	go c.send()
	go c.receive(br)
	return c, nil
}

// handshake runs Hello/HelloReply/Auth/AuthOK on conn (TLS first when configured) and returns
// the connection to use and the reader whose buffer already holds what followed.
func handshake(ctx context.Context, conn net.Conn, cfg ClientConfig, key []byte) (net.Conn, HelloReply, *bufio.Reader, error) {
	var hr HelloReply
	if cfg.TLS != nil {
		tc := cfg.TLS
		if tc.ServerName == "" {
			tc = tc.Clone()
			host, _, err := net.SplitHostPort(cfg.Addr)
			if err != nil {
				host = cfg.Addr
			}
			tc.ServerName = host
		}
		tlsConn := tls.Client(conn, tc)
		if err := tlsConn.HandshakeContext(ctx); err != nil {
			return conn, hr, nil, fmt.Errorf("tls: %w", err)
		}
		conn = tlsConn
	}
	br := NewFrameReader(conn, cfg.MaxBody)
	nonce := NewNonce()
	hello := Hello{Version: Version, MaxBody: cfg.MaxBody, OwnerID: cfg.OwnerID, Nonce: nonce,
		Incarnation: cfg.Incarnation, Name: cfg.Name}
	if err := roundTrip(conn, br, cfg.MaxBody, 0, &hello, &hr); err != nil {
		return conn, hr, nil, err
	}
	if hr.Version != Version {
		return conn, hr, nil, fmt.Errorf("server speaks version %d, this client %d: %w", hr.Version, Version, ErrBadVersion)
	}
	// The client proves first; the server proves itself in AuthOK.
	transcript := Transcript(&hello, &hr)
	auth := Auth{Proof: ClientProof(key, hr.Nonce, nonce, transcript)}
	var ok AuthOK
	if err := roundTrip(conn, br, cfg.MaxBody, 1, &auth, &ok); err != nil {
		return conn, hr, nil, err
	}
	if err := CheckServerProof(key, nonce, hr.Nonce, transcript, ok.Proof); err != nil {
		return conn, hr, nil, err
	}
	return conn, hr, br, nil
}

// roundTrip writes req and reads its reply into reply; an Error reply becomes its error.
func roundTrip(conn net.Conn, br *bufio.Reader, bodyMax uint32, id uint64, req, reply Message) error {
	if _, err := conn.Write(AppendFrame(nil, id, req)); err != nil {
		return fmt.Errorf("write %v: %w", req.Type(), err)
	}
	f, n, err := ReadFrame(br, bodyMax)
	if err != nil {
		return fmt.Errorf("read %v: %w", reply.Type(), err)
	}
	defer br.Discard(n)
	switch {
	case f.ID != id:
		return fmt.Errorf("%v reply with request id %d, want %d: %w", f.Type, f.ID, id, ErrMalformed)
	case f.Type == TypeError:
		var e ErrorReply
		if err := e.Parse(f.Body); err != nil {
			return err
		}
		return e.Err()
	case f.Type != reply.Type():
		return fmt.Errorf("%v reply to %v, want %v: %w", f.Type, req.Type(), reply.Type(), ErrMalformed)
	}
	return reply.Parse(f.Body)
}
