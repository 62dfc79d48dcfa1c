package sgio

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weftdb/weft/internal/assert"
)

// Client is one pipelined connection to a storage node: mechanism, no policy (no retries, no
// reconnects, no keepalive timer; the transaction node decides those).
//
// Invariants:
//   - Every request occupies one slot from Dial's in-flight bound from submission until its
//     reply is consumed (or the connection failed); a request id is a per-connection counter
//     shifted left by slotBits, or'ed with the slot's index, so a reply finds its slot without
//     a map and a stale id never matches a reused slot.
//   - A slot moves free -> queued -> writing -> written -> (replying) -> done -> free, under
//     mu. Only the sender moves queued to writing and writing to written; only the receiver
//     delivers replies and, once the sender has exited, fails what is left.
//   - One slot beyond the bound (below MaxInflightLimit) is kept for urgent requests
//     (CallIntoUrgent), which take it before any other, so a renewal never waits for a window
//     full of other requests. Urgent requests queue ahead of the others, and the sender does
//     not yield while one waits.
//   - The sender holds a request's Message only between taking it and the end of its write; a
//     reply implies the write of its request is complete, so no waiter is released while the
//     client still reads its request's bytes.
//
// All methods are safe for concurrent use by any number of goroutines, except from inside a
// Send callback (see Send).
type Client struct {
	conn         net.Conn
	addr         string
	hello        HelloReply
	bodyMax      uint32        // the largest reply body this side accepts
	sendMax      uint32        // the largest request body the server accepts
	writeTimeout time.Duration // bounds one flush

	free         chan uint32   // free slot indexes: the in-flight bound
	urgentFree   chan uint32   // cap 1: the slot kept for urgent requests (CallIntoUrgent), beyond the bound; nil at MaxInflightLimit
	urgentSlot   uint32        // that slot's index, when urgentFree is not nil
	bound        int           // the in-flight bound of the other requests (MaxInflight)
	wake         chan struct{} // cap 1: there is work for the sender
	dead         chan struct{} // closed when the connection fails
	senderDone   chan struct{}
	receiverDone chan struct{}

	mu    sync.Mutex
	slots []slot   // fixed length; &slots[i] is stable
	queue []uint32 // slots waiting for the sender: urgent ones first, each kind in submission order
	seq   uint64   // request counter
	err   error    // why the connection failed; nil while it works

	// urgent counts the urgent requests in queue (changed under mu): while any waits, the
	// sender writes at once instead of yielding for more requests to join its write.
	urgent atomic.Int32

	requests atomic.Uint64
	writes   atomic.Uint64
}

const (
	// slotBits is the number of low id bits that name the slot.
	slotBits = 16
	// MaxInflightLimit caps a client's in-flight bound.
	MaxInflightLimit = 1 << slotBits
	// DefaultDialTimeout bounds Dial when ClientConfig.DialTimeout is 0.
	DefaultDialTimeout = 10 * time.Second
	// DefaultWriteTimeout bounds one flush when ClientConfig.WriteTimeout is 0.
	DefaultWriteTimeout = 10 * time.Second
	// DefaultMaxBody is the reply body limit when ClientConfig.MaxBody is 0.
	DefaultMaxBody = 8 << 20
)

type slotState uint8

const (
	slotFree     slotState = iota
	slotQueued             // in queue; nothing sent
	slotWriting            // taken by the sender; bytes may be on the wire
	slotWritten            // the write completed; awaiting the reply
	slotReplying           // the receiver is copying the reply
	slotDone               // reply or error set; a Call collects it
)

type slot struct {
	id         uint64
	state      slotState
	want       Type               // the reply type that answers the request
	urgent     bool               // CallIntoUrgent's: counted in Client.urgent while queued
	msg        Message            // until the sender takes it
	fn         func(Frame, error) // Send's callback; nil for Call
	abandoned  bool               // the Call returned ErrUnknownOutcome: drop the reply
	cancelWait bool               // the Call's ctx ended while writing: signal when written
	ch         chan struct{}      // cap 1: wakes the Call waiting on this slot
	reply      Frame              // for a Call: the owned reply
	err        error              // for a Call: the failure
}

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

// Hello reports the server's HelloReply: its version, sync mode and limits.
func (c *Client) Hello() HelloReply { return c.hello }

// MaxRequestBody reports the largest request body the server accepts (HelloReply.MaxBody):
// Send refuses a larger one, and a Sealer must not grow beyond it. Any goroutine.
func (c *Client) MaxRequestBody() int { return int(c.sendMax) }

// MaxInflight reports the connection's in-flight bound. An urgent request (CallIntoUrgent)
// may take one slot beyond it.
func (c *Client) MaxInflight() int { return c.bound }

// Done returns a channel that is closed when the connection has failed or was closed.
func (c *Client) Done() <-chan struct{} { return c.dead }

// Err reports why the connection failed (wrapping ErrConnClosed and the cause), or nil while
// it works.
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// ClientStats counts a client's traffic since Dial.
type ClientStats struct {
	Requests uint64 // requests handed to the socket
	Writes   uint64 // writes (writev calls, or flattened Writes) that carried them; counted as each starts
}

// Stats reports the client's counters: Requests/Writes is the batching factor.
func (c *Client) Stats() ClientStats {
	return ClientStats{Requests: c.requests.Load(), Writes: c.writes.Load()}
}

// Call sends m and waits for its reply, which it returns owned by the caller (a copy of the
// frame). An Error reply returns its error (ErrorFromWire). m and the rows it references must
// not change until Call returns.
//
// ctx bounds the whole call: while waiting for an in-flight slot (then the error wraps ErrBusy
// and ctx's error), while queued (the request is withdrawn unsent; ctx's error), and after
// the request was handed to the socket (the error wraps ErrUnknownOutcome and ctx's error; a
// late reply is dropped). When the connection fails, the error wraps ErrConnClosed and the
// cause, and also ErrUnknownOutcome if the request had been handed to the socket.
func (c *Client) Call(ctx context.Context, m Message) (Frame, error) {
	idx, err := c.start(ctx, m, nil, false)
	if err != nil {
		return Frame{}, err
	}
	return c.wait(ctx, idx, m.Type())
}

// CallInto is Call, then reply.Parse of the owned reply body; reply's type must be the one
// that answers m.
func (c *Client) CallInto(ctx context.Context, m, reply Message) error {
	f, err := c.Call(ctx, m)
	if err != nil {
		return err
	}
	if f.Type != reply.Type() {
		return fmt.Errorf("sgio: %v reply to %v parsed as %v: %w", f.Type, m.Type(), reply.Type(), ErrMalformed)
	}
	return reply.Parse(f.Body)
}

// CallIntoUrgent is CallInto for a request that must not wait behind the connection's
// traffic, such as a lease renewal: it takes the in-flight slot kept for urgent requests (or
// any free slot when that one is taken), it goes into the sender's next write ahead of the
// requests queued before it, and the sender writes at once instead of yielding to let more
// requests join the write (a yield puts it behind every runnable goroutine, which took over a
// second on a node whose workers keep both cores busy). The reply still comes in the server's
// order. Only a Ping and a lease renewal (an Acquire with a nonzero epoch and no flags) may
// be urgent: the storage node answers them on its event loop without counting them in
// flight, which is what lets the kept slot go beyond the bound; anything else (an etcd
// grant's registration too: it is verified off the loop and counted) is a programming error.
func (c *Client) CallIntoUrgent(ctx context.Context, m, reply Message) error {
	switch a := m.(type) {
	case *Ping:
	case *Acquire:
		assert.That(a.Epoch != 0 && a.Flags == 0, "sgio: an urgent Acquire without an epoch or with flags (not a renewal)")
	default:
		assert.Failf("sgio: %v is not a request that may be urgent", m.Type())
	}
	idx, err := c.start(ctx, m, nil, true)
	if err != nil {
		return err
	}
	f, err := c.wait(ctx, idx, m.Type())
	if err != nil {
		return err
	}
	if f.Type != reply.Type() {
		return fmt.Errorf("sgio: %v reply to %v parsed as %v: %w", f.Type, m.Type(), reply.Type(), ErrMalformed)
	}
	return reply.Parse(f.Body)
}

// Send queues m and returns; done runs once with the reply: on the receiver goroutine, with a
// reply Frame that aliases the read buffer and is valid only until done returns (zero-copy
// consumers such as a cache fill copy what they need). An Error reply comes with its error
// (ErrorFromWire) and the Error frame. When the connection fails, done runs with a zero Frame
// and an error wrapping ErrConnClosed (and ErrUnknownOutcome when the request was sent), on
// the goroutine that ends the receiver.
//
// ctx bounds only the wait for an in-flight slot (ErrBusy) and is checked before queueing;
// once queued the request runs to completion or connection failure. If Send returns an error,
// done never runs. m and the rows it references must not change until done runs.
//
// done must not block, nor call Call, Send or Close on this client: the receiver reads nothing
// while it runs. m may be a Sealer, which may grow until the sender takes it; Send checks its
// body size against the server's limit as it is then, so the Sealer bounds its own growth.
func (c *Client) Send(ctx context.Context, m Message, done func(reply Frame, err error)) error {
	assert.That(done != nil, "sgio: Send without a callback")
	_, err := c.start(ctx, m, done, false)
	return err
}

// start checks m, takes a slot and queues m for the sender; an urgent m goes ahead of the
// queued requests that are not.
func (c *Client) start(ctx context.Context, m Message, fn func(Frame, error), urgent bool) (uint32, error) {
	t := m.Type()
	if !(t.IsRequest() && t != TypeHello && t != TypeAuth) {
		assert.Failf("sgio: %v is not a request a client may send", t)
	}
	if err := m.Validate(); err != nil {
		return 0, fmt.Errorf("sgio: %v request: %w", t, err)
	}
	if size := m.BodySize(); size > int(c.sendMax) {
		return 0, fmt.Errorf("sgio: %v request body of %d bytes, the server accepts %d: %w", t, size, c.sendMax, ErrFrameTooLarge)
	}
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("sgio: %v request not sent: %w", t, err)
	}
	idx, err := c.acquire(ctx, urgent)
	if err != nil {
		return 0, fmt.Errorf("sgio: %v request not sent: %w", t, err)
	}
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.releaseLocked(idx)
		c.mu.Unlock()
		return 0, err
	}
	c.seq++
	s := &c.slots[idx]
	if s.state != slotFree {
		assert.Failf("sgio: slot %d taken from the free list in state %d", idx, s.state)
	}
	*s = slot{id: c.seq<<slotBits | uint64(idx), state: slotQueued, want: t.Reply(), msg: m, fn: fn, ch: s.ch, urgent: urgent}
	if fn == nil && s.ch == nil {
		s.ch = make(chan struct{}, 1)
	}
	if urgent {
		// After the urgent requests already queued, before the others.
		at := int(c.urgent.Add(1)) - 1
		c.queue = slices.Insert(c.queue, at, idx)
	} else {
		c.queue = append(c.queue, idx)
	}
	if len(c.queue) > len(c.slots) {
		assert.Failf("sgio: queue of %d beyond the in-flight bound %d", len(c.queue), len(c.slots))
	}
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
	return idx, nil
}

// freeSlots reports the slots free now, the kept one included; tests read it.
func (c *Client) freeSlots() int { return len(c.free) + len(c.urgentFree) }

// acquire takes a free slot, waiting until ctx ends or the connection fails. An urgent
// request takes the reserved slot first, then any other.
func (c *Client) acquire(ctx context.Context, urgent bool) (uint32, error) {
	var reserved chan uint32 // nil (never ready) unless urgent
	if urgent {
		reserved = c.urgentFree
		select {
		case idx := <-reserved:
			return idx, nil
		default:
		}
	}
	select {
	case idx := <-c.free:
		return idx, nil
	default:
	}
	select {
	case idx := <-c.free:
		return idx, nil
	case idx := <-reserved:
		return idx, nil
	case <-c.dead:
		return 0, c.Err()
	case <-ctx.Done():
		return 0, fmt.Errorf("no free in-flight slot of %d: %w: %w", c.bound, ErrBusy, ctx.Err())
	}
}

// signal wakes the Call waiting on s, if it is not awake already. Called with mu held.
func signal(s *slot) {
	select {
	case s.ch <- struct{}{}:
	default:
	}
}

// releaseLocked frees slot idx. Called with mu held.
func (c *Client) releaseLocked(idx uint32) {
	s := &c.slots[idx]
	if s.ch != nil {
		select { // a signal the waiter did not need
		case <-s.ch:
		default:
		}
	}
	*s = slot{ch: s.ch}
	if c.urgentFree != nil && idx == c.urgentSlot {
		c.urgentFree <- idx // never blocks: the index is in the channel at most once
		return
	}
	c.free <- idx // never blocks: each index is in the channel at most once
}

// wait waits for the reply of the Call in slot idx.
func (c *Client) wait(ctx context.Context, idx uint32, t Type) (Frame, error) {
	s := &c.slots[idx]
	select {
	case <-s.ch:
		c.mu.Lock()
		if s.state != slotDone {
			assert.Failf("sgio: slot %d woken in state %d", idx, s.state)
		}
		return c.collectLocked(idx)
	case <-ctx.Done():
	}
	c.mu.Lock()
	if s.state == slotQueued {
		for i, q := range c.queue {
			if q == idx {
				c.queue = append(c.queue[:i], c.queue[i+1:]...)
				break
			}
		}
		if s.urgent {
			c.urgent.Add(-1)
		}
		c.releaseLocked(idx)
		c.mu.Unlock()
		return Frame{}, fmt.Errorf("sgio: %v request withdrawn unsent: %w", t, ctx.Err())
	}
	// Wait until the sender is done with the request's bytes, or the reply is here: the
	// caller may reuse them once Call returns.
	for s.state == slotWriting || s.state == slotReplying {
		s.cancelWait = true
		c.mu.Unlock()
		<-s.ch
		c.mu.Lock()
	}
	if s.state == slotDone {
		return c.collectLocked(idx)
	}
	if s.state != slotWritten {
		assert.Failf("sgio: slot %d in state %d after cancel", idx, s.state)
	}
	s.abandoned = true // the receiver frees the slot when the reply comes
	id := s.id
	c.mu.Unlock()
	return Frame{}, fmt.Errorf("sgio: %v request %d: %w: %w", t, id, ErrUnknownOutcome, ctx.Err())
}

// collectLocked takes the result of slot idx, frees it and unlocks mu.
func (c *Client) collectLocked(idx uint32) (Frame, error) {
	s := &c.slots[idx]
	f, err := s.reply, s.err
	c.releaseLocked(idx)
	c.mu.Unlock()
	return f, err
}

// Sealer is a Message that gathers parts while it waits in a client's queue (a transaction
// node merges the reads of many goroutines into one ReadPages): the client's sender calls
// Seal, with the client's lock held, when it takes the message from the queue, before it
// encodes it (BodySize, AppendBody), and the message must not change from then on. Seal must
// not block nor call the client. Its methods other than Seal may be called concurrently with
// the message's own additions, so it locks what they read.
type Sealer interface {
	Message
	Seal()
}

// sentItem is a request the sender took: its id and slot, and its message until written.
type sentItem struct {
	id  uint64
	idx uint32
	msg Message
}

// send is the sender goroutine: it takes everything queued and writes it with one writev.
func (c *Client) send() {
	defer close(c.senderDone)
	var w Writer
	items := make([]sentItem, 0, len(c.slots))
	for {
		select {
		case <-c.wake:
		case <-c.dead:
			return
		}
		// Yield once before taking the queue: requests submitted meanwhile join this write.
		// Not when an urgent request waits: the yield puts the sender behind every runnable
		// goroutine.
		if c.urgent.Load() == 0 {
			runtime.Gosched()
		}
		c.mu.Lock()
		if c.err != nil {
			c.mu.Unlock()
			return
		}
		for _, idx := range c.queue {
			s := &c.slots[idx]
			s.state = slotWriting
			if m, ok := s.msg.(Sealer); ok {
				m.Seal()
			}
			items = append(items, sentItem{id: s.id, idx: idx, msg: s.msg})
			s.msg = nil
		}
		c.queue = c.queue[:0]
		c.urgent.Store(0)
		c.mu.Unlock()
		if len(items) == 0 {
			continue
		}
		for _, it := range items {
			w.Append(it.id, it.msg)
		}
		c.requests.Add(uint64(len(items)))
		c.writes.Add(1)
		err := c.conn.SetWriteDeadline(time.Now().Add(c.writeTimeout))
		if err == nil {
			_, err = w.WriteTo(c.conn)
		}
		w.Reset()
		if err != nil {
			c.fail(fmt.Errorf("write: %w", err))
			return
		}
		c.mu.Lock()
		for _, it := range items {
			s := &c.slots[it.idx]
			if s.id == it.id && s.state == slotWriting {
				s.state = slotWritten
				if s.cancelWait {
					signal(s)
				}
			}
		}
		c.mu.Unlock()
		clear(items) // drop the messages
		items = items[:0]
	}
}

// receive is the receiver goroutine: it reads replies and hands them to their waiters, and
// when the connection ends, fails every request left once the sender has stopped.
func (c *Client) receive(br *bufio.Reader) {
	defer close(c.receiverDone)
	var err error
	for {
		var f Frame
		var n int
		if f, n, err = ReadFrame(br, c.bodyMax); err != nil {
			err = fmt.Errorf("read: %w", err)
			break
		}
		if err = c.dispatch(f); err != nil {
			break
		}
		if _, err = br.Discard(n); err != nil {
			break
		}
	}
	c.fail(err)
	<-c.senderDone
	c.failAll()
}

// dispatch hands reply f to its waiter. An error breaks the connection: the server broke the
// protocol.
func (c *Client) dispatch(f Frame) error {
	var replyErr error
	if f.Type == TypeError {
		var e ErrorReply
		if err := e.Parse(f.Body); err != nil {
			return fmt.Errorf("reply to request %d: %w", f.ID, err)
		}
		replyErr = e.Err()
	}
	idx := uint32(f.ID & (MaxInflightLimit - 1))
	c.mu.Lock()
	if int(idx) >= len(c.slots) || c.slots[idx].id != f.ID ||
		(c.slots[idx].state != slotWriting && c.slots[idx].state != slotWritten) {
		c.mu.Unlock()
		return fmt.Errorf("%v reply for request id %d, which is not in flight: %w", f.Type, f.ID, ErrMalformed)
	}
	s := &c.slots[idx]
	if f.Type != s.want && f.Type != TypeError {
		c.mu.Unlock()
		return fmt.Errorf("%v reply to request %d, want %v or Error: %w", f.Type, f.ID, s.want, ErrMalformed)
	}
	switch {
	case s.abandoned:
		c.releaseLocked(idx)
		c.mu.Unlock()
	case s.fn != nil:
		fn := s.fn
		c.releaseLocked(idx)
		c.mu.Unlock()
		fn(f, replyErr)
	case replyErr != nil:
		s.err = replyErr
		s.state = slotDone
		signal(s)
		c.mu.Unlock()
	default:
		s.state = slotReplying
		c.mu.Unlock()
		body := make([]byte, len(f.Body))
		copy(body, f.Body)
		c.mu.Lock()
		s.reply = Frame{Type: f.Type, ID: f.ID, Body: body}
		s.state = slotDone
		signal(s)
		c.mu.Unlock()
	}
	return nil
}

// connError is why a connection failed: it matches ErrConnClosed and the cause.
type connError struct {
	addr  string
	cause error
}

// Error reports the address and the cause.
func (e *connError) Error() string {
	return "sgio: connection to " + e.addr + " closed: " + e.cause.Error()
}

// Unwrap reports ErrConnClosed and the cause, so errors.Is finds either.
func (e *connError) Unwrap() []error { return []error{ErrConnClosed, e.cause} }

// fail records the first cause of the connection's end and closes the socket, which stops
// both goroutines. Later calls do nothing.
func (c *Client) fail(cause error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = &connError{addr: c.addr, cause: cause}
	close(c.dead)
	c.mu.Unlock()
	_ = c.conn.Close()
}

// failAll fails every request still in a slot. Only the receiver calls it, after the sender
// has exited, so no request's bytes are in use any more.
func (c *Client) failAll() {
	type failed struct {
		fn  func(Frame, error)
		err error
	}
	var callbacks []failed
	c.mu.Lock()
	c.queue = c.queue[:0]
	c.urgent.Store(0)
	for i := range c.slots {
		s := &c.slots[i]
		if s.state == slotFree || s.state == slotDone {
			continue
		}
		err := c.err
		if s.state != slotQueued {
			err = fmt.Errorf("%w (request %d was sent: %w)", c.err, s.id, ErrUnknownOutcome)
		}
		switch {
		case s.abandoned:
			c.releaseLocked(uint32(i))
		case s.fn != nil:
			callbacks = append(callbacks, failed{s.fn, err})
			c.releaseLocked(uint32(i))
		default:
			s.err = err
			s.state = slotDone
			signal(s)
		}
	}
	c.mu.Unlock()
	for _, f := range callbacks {
		f.fn(Frame{}, f.err)
	}
}

// Close closes the connection: every request still in flight fails with an error wrapping
// ErrConnClosed (and net.ErrClosed). It waits for the sender and receiver goroutines to exit.
// Close is idempotent and returns nil; it must not be called from a Send callback.
func (c *Client) Close() error {
	c.fail(net.ErrClosed)
	<-c.receiverDone
	return nil
}
