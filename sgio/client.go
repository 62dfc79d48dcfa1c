package sgio

import (
	"context"
	"fmt"
	"net"
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

// Close closes the connection: every request still in flight fails with an error wrapping
// ErrConnClosed (and net.ErrClosed). It waits for the sender and receiver goroutines to exit.
// Close is idempotent and returns nil; it must not be called from a Send callback.
func (c *Client) Close() error {
	c.fail(net.ErrClosed)
	<-c.receiverDone
	return nil
}
