package server

import "github.com/weftdb/weft/sgio"

// The replies of a session: queued in pending, written by one write at a time (the loop's own
// at the end of its turn, else an asynchronous write), their requests ended once written.

// pendingBytes reports the bytes of the replies not yet handed to the transport.
func (s *session) pendingBytes() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pending.Len()
}

// replyReserved queues the reply to a counted request (an Error reply when err is set) and
// gives back its reservation of reserveRoom, under one lock.
func (s *session) replyReserved(id uint64, reply sgio.Message, keep *[]byte, err error, size int64) {
	if err != nil {
		r := sgio.NewErrorReply(err)
		r.Message = s.srv.scrubPaths(r.Message)
		if keep != nil {
			putRowBuf(keep)
		}
		reply, keep = r, nil
	}
	s.replyThen(id, reply, keep, true, false, size)
}

// signalRoomLocked wakes every reserveRoom. Caller holds mu.
func (s *session) signalRoomLocked() {
	if s.room != nil {
		close(s.room)
		s.room = nil
	}
}

// replyLoop queues a reply produced on the loop for a request that was not counted in
// flight (the handshake, an inline Pong). The loop writes it before inbound returns.
func (s *session) replyLoop(id uint64, m sgio.Message) { s.reply(id, m, nil, false) }

// replyError queues the Error reply carrying err (sgio.NewErrorReply: its code maps back to
// the same sentinel at the client).
func (s *session) replyError(id uint64, err error, counted bool) {
	r := sgio.NewErrorReply(err)
	r.Message = s.srv.scrubPaths(r.Message)
	s.reply(id, r, nil, counted)
}

// replyRejected counts a request refused before it was begun (a body or field that does not
// check out) among the rejected frames and replies err to it, not counted as in flight.
func (s *session) replyRejected(id uint64, err error) {
	s.srv.counters.rejectedFrames.Add(1)
	s.replyError(id, err, false)
}

// reply queues a reply and starts a write unless one is in progress or the loop will write
// at the end of its turn. counted says whether it ends a request in flight; keep is a buffer
// the reply's rows live in (pooled: getRowBuf), kept until the write is done, then put back.
// Any goroutine may call it.
func (s *session) reply(id uint64, m sgio.Message, keep *[]byte, counted bool) {
	s.replyThen(id, m, keep, counted, false, 0)
}

// replyThen is reply; closeAfter closes the connection once the reply is written (set with
// the reply, under one lock, so no other write's completion can close first); release gives
// back a reservation of reserveRoom under the same lock as the reply is queued, so the reply's
// bytes are never counted twice.
func (s *session) replyThen(id uint64, m sgio.Message, keep *[]byte, counted, closeAfter bool, release int64) {
	s.mu.Lock()
	if closeAfter {
		s.closeAfterWrite = true
	}
	if release != 0 {
		s.reserved -= release
		s.signalRoomLocked()
	}
	if s.isClosed {
		s.mu.Unlock()
		if keep != nil {
			putRowBuf(keep)
		}
		if counted {
			s.endRequests(1)
		}
		return
	}
	s.pending.Append(id, m)
	if held := s.pending.Len() + s.sending.Len() + s.reserved; held > s.heldPeak {
		s.heldPeak = held
	}
	if counted {
		s.pendingCounted++
	}
	if keep != nil {
		s.pendingKeep = append(s.pendingKeep, keep)
	}
	if s.busy || s.inLoop {
		s.mu.Unlock()
		return
	}
	bufs, counted2 := s.takePendingLocked()
	s.asyncCounted = counted2 // one write at a time (busy): asyncWriteDone takes it
	err := s.tr.writeAsync(bufs, s.asyncDoneFn)
	if err != nil {
		s.asyncCounted = 0
	}
	s.mu.Unlock()
	if err != nil {
		s.writeDone(counted2, err, false)
	}
}

// asyncWriteDone is writeAsync's callback, on the loop: it ends the write in progress with
// the requests its replies answered.
func (s *session) asyncWriteDone(err error) {
	s.mu.Lock()
	counted := s.asyncCounted
	s.asyncCounted = 0
	s.mu.Unlock()
	s.writeDone(counted, err, true)
}

// takePendingLocked moves pending to sending and marks a write in progress. Caller holds mu.
func (s *session) takePendingLocked() (bufs [][]byte, counted int) {
	s.busy = true
	s.pending, s.sending = s.sending, s.pending
	s.pendingKeep, s.sendingKeep = s.sendingKeep, s.pendingKeep
	counted, s.pendingCounted = s.pendingCounted, 0
	s.srv.counters.writes.Add(1)
	s.srv.counters.bytesOut.Add(uint64(s.sending.Len()))
	return s.sending.Buffers(), counted
}

// writeDone ends the write in progress: its replies' requests are answered. onLoop says the
// caller is the connection's loop, which then writes what has piled up meanwhile.
func (s *session) writeDone(counted int, err error, onLoop bool) {
	s.mu.Lock()
	s.sending.Reset()
	for _, b := range s.sendingKeep {
		putRowBuf(b) // written or copied: nothing references it now
	}
	clear(s.sendingKeep)
	s.sendingKeep = s.sendingKeep[:0]
	s.busy = false
	s.endRequests(counted)
	wake := s.wantWake && !s.isClosed
	s.wantWake = false
	s.signalRoomLocked()
	if wake {
		s.tr.wake()
	}
	if err == nil && s.closeAfterWrite && s.pending.Len() == 0 && !s.isClosed {
		s.markClosedLocked()
		s.tr.close()
		s.mu.Unlock()
		return
	}
	if err != nil && !s.isClosed {
		s.markClosedLocked()
		s.tr.close()
		s.mu.Unlock()
		s.logger().Info("storenode: closing connection: write failed", "err", err)
		return
	}
	s.mu.Unlock()
	if onLoop {
		s.flushLoop()
	}
}

// flushLoop writes the pending replies, synchronously, on the loop; a write in progress will
// write them when it is done instead.
func (s *session) flushLoop() {
	for {
		s.mu.Lock()
		if s.busy || s.isClosed || s.pending.Len() == 0 {
			s.mu.Unlock()
			return
		}
		bufs, counted := s.takePendingLocked()
		s.mu.Unlock()
		err := s.tr.writeLoop(bufs)
		if err == errWriteLater {
			// Sliced (gnet, server_gnet.go): asyncWriteDone ends it on the loop, later.
			s.mu.Lock()
			s.asyncCounted = counted
			s.mu.Unlock()
			return
		}
		s.writeDone(counted, err, false)
		if err != nil {
			return
		}
	}
}
