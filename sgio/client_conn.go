package sgio

import (
	"bufio"
	"fmt"
	"runtime"
	"time"
)

// A Client's connection goroutines: the sender writes what is queued in one writev, the
// receiver hands each reply to its slot; a failure of either fails every request left.

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
