package txnode

import (
	"context"
	"sync"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/sgio"
)

// The remote store's commit path: the batches in flight (remoteCommit, pooled, in the
// commitQueue, seq order), their sends, acknowledgements and recycling.

// remoteCommit is a batch in flight, kept until acknowledged so it can be sent again. It is
// pooled: one that ended normally (finish) is reused once it has left the queue, its done has
// returned and no send of it is running (popped, doneCalled, sends == 0, under mu); one failed
// by Close is dropped, as a late reply could still name it.
type remoteCommit struct {
	s    *remoteStore
	msg  sgio.Commit
	done func(uint64, error)
	ack  func(sgio.Frame, error) // rc.onAck, made once
	gen  uint64                  // connection it was last sent on
	fin  bool

	popped, doneCalled bool
	sends              int // calls of send on it running now (under mu): a Send still reads msg
}

var remoteCommitPool sync.Pool // of *remoteCommit; New is set in init (recycle refers to the pool)

func init() {
	remoteCommitPool.New = func() any {
		rc := &remoteCommit{}
		rc.ack = rc.onAck
		return rc
	}
}

// recycle returns rc to the pool. Caller holds s.mu; rc has left the queue and its done has
// returned.
func (rc *remoteCommit) recycle() {
	clear(rc.msg.Segments) // drop the rows
	*rc = remoteCommit{ack: rc.ack, msg: sgio.Commit{Fences: rc.msg.Fences[:0], Segments: rc.msg.Segments[:0]}}
	remoteCommitPool.Put(rc)
}

// commitQueue is the FIFO of batches in flight: one slice with a head index, compacted
// rather than regrown, so a steady flow of commits allocates nothing.
type commitQueue struct {
	items []*remoteCommit
	head  int
}

// live returns the batches in the queue (finished ones included), oldest first.
func (q *commitQueue) live() []*remoteCommit { return q.items[q.head:] }

func (q *commitQueue) push(rc *remoteCommit) {
	if q.head > 0 && len(q.items) == cap(q.items) {
		n := copy(q.items, q.items[q.head:])
		clear(q.items[n:])
		q.items, q.head = q.items[:n], 0
	}
	q.items = append(q.items, rc)
}

// popFinished removes the finished batches at the head and calls fn on each.
func (q *commitQueue) popFinished(fn func(*remoteCommit)) {
	for q.head < len(q.items) && q.items[q.head].fin {
		fn(q.items[q.head])
		q.items[q.head] = nil
		q.head++
	}
	if q.head == len(q.items) {
		q.items, q.head = q.items[:0], 0
	}
}

// reset empties the queue (Close), dropping its batches.
func (q *commitQueue) reset() {
	clear(q.items)
	q.items, q.head = q.items[:0], 0
}

func (s *remoteStore) pendingLocked() []*remoteCommit {
	var out []*remoteCommit
	for _, rc := range s.commits.live() {
		if !rc.fin {
			out = append(out, rc)
		}
	}
	return out
}

// Commit sends a batch; the rows are gathered into the write by reference.
func (s *remoteStore) Commit(b *base.Batch, done func(uint64, error)) {
	rc := remoteCommitPool.Get().(*remoteCommit)
	rc.s, rc.done = s, done
	rc.msg.Owner, rc.msg.Seq = b.Owner, b.Seq
	// Copied (the headers; the rows by reference): a send may still read msg after done.
	rc.msg.Fences = append(rc.msg.Fences, b.Fences...)
	rc.msg.Segments = append(rc.msg.Segments, b.Segments...)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		done(0, ErrClosed)
		return
	}
	s.commits.push(rc)
	c, gen, dialing := s.conn, s.gen, s.dialing
	if !dialing {
		rc.gen = gen
		rc.sends++
	}
	s.mu.Unlock()
	if !dialing {
		s.sendTracked(c, gen, rc) // otherwise the reconnect sends it, after the older ones
	}
}

// sendTracked is send of a batch whose sends count the caller raised under mu: until it is
// lowered again the batch is not recycled, even if a reconnect resent it and it was
// acknowledged meanwhile (this Send may still be reading its message).
func (s *remoteStore) sendTracked(c *sgio.Client, gen uint64, rc *remoteCommit) {
	s.send(c, gen, rc)
	s.mu.Lock()
	rc.sends--
	rc.maybeRecycle()
	s.mu.Unlock()
}

// send writes rc on connection gen; a broken connection leaves it for the reconnect.
func (s *remoteStore) send(c *sgio.Client, gen uint64, rc *remoteCommit) {
	err := c.Send(context.Background(), &rc.msg, rc.ack)
	if err != nil && !retryable(err) {
		s.finish(rc, 0, err)
	}
}

// onAck is the reply callback of rc's sends, on the connection's receiver goroutine.
func (rc *remoteCommit) onAck(f sgio.Frame, err error) {
	var ack sgio.CommitAck
	if err == nil {
		err = ack.Parse(f.Body)
	}
	if err != nil && retryable(err) {
		rc.s.mu.Lock()
		gen := rc.gen
		rc.s.mu.Unlock()
		rc.s.noteIdentityLost(err, gen)
		return // the reconnect sends it again, or fails it
	}
	rc.s.finish(rc, ack.LSN, err)
}

func (s *remoteStore) finish(rc *remoteCommit, lsn uint64, err error) {
	s.mu.Lock()
	if rc.fin {
		s.mu.Unlock()
		return
	}
	rc.fin = true
	s.commits.popFinished(popped)
	s.mu.Unlock()
	rc.done(lsn, err)
	s.mu.Lock()
	rc.doneCalled = true
	rc.maybeRecycle()
	s.mu.Unlock()
}

// popped marks a batch that left the queue, recycling it if nothing else uses it. Caller
// holds s.mu.
func popped(rc *remoteCommit) {
	rc.popped = true
	rc.maybeRecycle()
}

// maybeRecycle recycles rc once it has left the queue, its done has returned and no send of
// it is running. Caller holds s.mu.
func (rc *remoteCommit) maybeRecycle() {
	if rc.popped && rc.doneCalled && rc.sends == 0 {
		rc.recycle()
	}
}
