package server

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/logicpage"
	"github.com/weftdb/weft/sgio"
	"github.com/weftdb/weft/storenode"
)

// The requests of an open session: inbound decodes the frames of a turn on the loop, handle
// routes each (answered inline, queued for the commit goroutine or a read goroutine, or run on
// a goroutine of its own), exec executes the requests that run on a goroutine.

// inbound consumes the whole frames at the start of buf, the connection's unread inbound
// bytes, and reports how many bytes it consumed and whether the connection must be closed
// (the caller closes it: gnet.Close, or the TLS reader's return). Only the connection's loop
// calls it. buf is read only during the call: whatever a request needs later is parsed or
// copied out of it first (see the package doc's buffer lifetimes). The replies it produces
// are written with one write before it returns (when no write is in progress; else right
// after that write), an Error reply before a close included.
func (s *session) inbound(buf []byte) (n int, closeNow bool) {
	s.lastActive.Store(time.Now().UnixNano())
	s.mu.Lock()
	s.inLoop = true
	s.mu.Unlock()
	defer func() {
		s.startCommits()
		if t := s.turnReads; t != nil {
			s.turnReads = nil
			s.srv.workers.Add(1)
			go t.run() // a method value made with the pooled turn: no closure
		}
		s.mu.Lock()
		s.inLoop = false
		s.mu.Unlock()
		s.flushLoop()
		if closeNow {
			s.mu.Lock()
			if !s.isClosed {
				s.markClosedLocked()
			}
			s.mu.Unlock()
		}
	}()
	s.needBytes, s.turnNow, s.paused = 0, 0, false
	s.mu.Lock()
	if s.busy && s.pending.Len() >= turnReplyMaxBytes && !s.readOn {
		// The replies of earlier turns wait for the write in progress: read nothing more
		// until it is done (writeDone wakes the loop).
		s.wantWake, s.paused = true, true
		s.mu.Unlock()
		return 0, false
	}
	s.mu.Unlock()
	for n < len(buf) {
		// Before authentication only handshake-sized frames are read: a stranger's frame
		// header that claims more is refused before its body is waited for (or buffered).
		limit := s.srv.cfg.MaxBody
		if s.state != stateOpen {
			limit = sgio.HandshakeBodyMax()
		}
		f, size, err := sgio.Decode(buf[n:], limit)
		switch {
		case err == sgio.ErrNeedMore:
			if size > sgio.HeaderSize {
				s.needBytes = size
			}
			return n, false
		case errors.Is(err, sgio.ErrUnknownType) && s.state == stateOpen:
			// The frame is intact: refuse it and go on.
			s.srv.counters.rejectedFrames.Add(1)
			s.srv.counters.bytesIn.Add(uint64(size))
			s.replyError(f.ID, err, false)
			n += size
			continue
		case err != nil:
			s.srv.counters.rejectedFrames.Add(1)
			return n, s.reject(rawID(buf[n:]), err, "bad frame")
		}
		n += size
		s.srv.counters.bytesIn.Add(uint64(size))
		if !s.handle(f) {
			return n, true
		}
		if n < len(buf) && s.pendingBytes() >= turnReplyMaxBytes {
			// The turn holds its bound of replies: write them, and take the rest of the
			// inbound bytes in another turn.
			s.paused = true
			s.tr.wake()
			return n, false
		}
	}
	return n, false
}

// rawID reads the request id of a frame header that failed to decode, or 0.
func rawID(b []byte) uint64 {
	if len(b) < 16 {
		return 0
	}
	return binary.LittleEndian.Uint64(b[8:16])
}

// reject answers a frame that breaks the protocol with an Error reply and reports true: the
// connection is closed once the reply is written.
func (s *session) reject(id uint64, err error, what string) bool {
	if s.state == stateOpen {
		s.logger().Warn("storenode: closing connection: "+what, "err", err)
	} else {
		// Anyone can connect: what strangers do is logged at a bounded rate.
		s.srv.limitedLog("storenode: closing connection: "+what, "conn", s.id, "remote", s.remote, "err", err)
	}
	s.replyError(id, err, false)
	return true
}

// handle runs one decoded frame on the loop and reports false when the connection must close.
// f.Body aliases the inbound buffer: valid during this call only.
func (s *session) handle(f sgio.Frame) bool {
	switch s.state {
	case stateRefused:
		return false // the refusal went out at connect
	case stateFailed:
		return true // the failure is answered after the delay; frames meanwhile are dropped
	case stateHello:
		if f.Type != sgio.TypeHello {
			s.srv.counters.authFailures.Add(1)
			return !s.reject(f.ID, fmt.Errorf("storenode: %v before Hello: %w", f.Type, sgio.ErrAuthFailed), "request before authentication")
		}
		return s.hello(f)
	case stateAuth:
		if f.Type != sgio.TypeAuth {
			s.srv.counters.authFailures.Add(1)
			return !s.reject(f.ID, fmt.Errorf("storenode: %v before Auth: %w", f.Type, sgio.ErrAuthFailed), "request before authentication")
		}
		return s.auth(f)
	}
	if !f.Type.IsRequest() || f.Type == sgio.TypeHello || f.Type == sgio.TypeAuth {
		s.srv.counters.rejectedFrames.Add(1)
		return !s.reject(f.ID, fmt.Errorf("storenode: %v is not a request of an open session: %w", f.Type, sgio.ErrMalformed), "protocol violation")
	}
	s.srv.counters.requests.Add(1)
	if !s.role.allows(f.Type) {
		s.forbid(f) // before the body is parsed, a lease renewed or anything queued
		return true
	}
	if s.renewDue() {
		s.renew() // on the loop: Engine.Renew takes no engine lock
	}
	if f.Type == sgio.TypeCommit {
		s.commit(f)
		return true
	}
	if f.Type == sgio.TypeBackup {
		s.backupRequest(f)
		return true
	}
	if f.Type == sgio.TypeTxnPrepare {
		s.txnPrepare(f)
		return true
	}
	if f.Type == sgio.TypeMoveWrite {
		s.moveWrite(f)
		return true
	}
	var readBytes int64
	if f.Type == sgio.TypeReadPages || f.Type == sgio.TypePageDir {
		// A read that waits for a goroutine keeps its parsed request: its body counts against
		// the queue's bounds (MaxQueuedBytes, MaxQueuedBytesTotal), checked before it is parsed.
		readBytes = int64(len(f.Body))
		if err := s.queueFull(readBytes); err != nil {
			s.srv.counters.busyReplies.Add(1)
			s.replyError(f.ID, err, false)
			return true
		}
	}
	var m sgio.Message
	if f.Type == sgio.TypeReadPages {
		m = &s.loopRead // the loop's own: copied if the read leaves the loop (ownedRead)
		defer s.trimLoopRead()
	} else {
		m = sgio.NewMessage(f.Type)
	}
	if err := m.Parse(f.Body); err != nil {
		s.replyRejected(f.ID, err)
		return true
	}
	switch f.Type {
	case sgio.TypePing:
		s.replyLoop(f.ID, &sgio.Pong{})
		return true
	case sgio.TypeAcquire:
		// An etcd grant is verified in etcd: never on the loop, it goes to a goroutine
		// below (run: bounded by MaxInflight per connection, and by the engine's
		// verification slots and timeout).
		if a := m.(*sgio.Acquire); a.Epoch != 0 && a.Flags&sgio.AcquireEtcdGrant == 0 {
			s.renewGrant(f.ID, a)
			return true
		}
	case sgio.TypeReadPages, sgio.TypePageDir:
		if f.Type == sgio.TypeReadPages && s.readInline(f.ID, m.(*sgio.ReadPages)) {
			return true
		}
		if err := s.queueAdd(readBytes); err != nil {
			s.srv.counters.busyReplies.Add(1)
			s.replyError(f.ID, err, false)
			return true
		}
		if !s.begin(f.ID) {
			s.queueRelease(readBytes)
			return true
		}
		t := s.turn()
		if f.Type == sgio.TypeReadPages {
			m = t.ownedRead(&s.loopRead)
		}
		t.reads = append(t.reads, readRequest{f.ID, m, readBytes})
		return true
	}
	if !s.begin(f.ID) {
		return true
	}
	s.srv.workers.Add(1)
	go s.run(f.ID, m)
	return true
}

// begin counts a request in flight, or answers it with ErrBusy or ErrShuttingDown and
// reports false.
func (s *session) begin(id uint64) bool {
	if s.inflight.Load() >= int64(s.srv.cfg.MaxInflight) {
		s.srv.counters.busyReplies.Add(1)
		s.replyError(id, fmt.Errorf("storenode: %d requests in flight on this connection, the limit: %w",
			s.srv.cfg.MaxInflight, sgio.ErrBusy), false)
		return false
	}
	if !s.srv.requests.begin() {
		s.replyError(id, fmt.Errorf("storenode: server is shutting down: %w", sgio.ErrShuttingDown), false)
		return false
	}
	s.inflight.Add(1)
	return true
}

// run executes one request on its own goroutine and replies. Like the reads (runReads), it
// first reserves room for its reply under connReplyMaxBytes: a client that pipelines
// requests with large replies (ListTables) and reads nothing holds a bounded amount of them.
func (s *session) run(id uint64, m sgio.Message) {
	defer s.srv.workers.Done()
	size := s.replySizeBound(m)
	if !s.reserveRoom(size) {
		s.endRequests(1) // closed: no reply will go out
		return
	}
	s.renew()
	reply, keep, err := s.exec(m)
	s.replyReserved(id, reply, keep, err, size)
}

// exec executes a request other than Commit. keep is a buffer the reply's rows live in.
func (s *session) exec(m sgio.Message) (reply sgio.Message, keep *[]byte, err error) {
	e := s.srv.eng
	switch m := m.(type) {
	case *sgio.Ping:
		return &sgio.Pong{}, nil, nil
	case *sgio.CreateTable:
		// A client's tables are bounded per owner (MaxTablesPerOwner), an operator's by
		// MaxTables alone.
		var ti base.TableInfo
		var err error
		if s.role&roleOperator != 0 {
			ti, err = e.CreateTable(m.Name, int(m.RowBytes))
		} else {
			ti, err = e.CreateTableAs(m.Name, int(m.RowBytes), s.owner)
		}
		if err != nil {
			return nil, nil, err
		}
		return wireTableInfo(ti), nil, nil
	case *sgio.CreateClusterTable:
		if err := s.mayCreateCluster(m); err != nil {
			return nil, nil, err
		}
		l := base.ClusterLayout{Partitions: m.Layout.Partitions, StripePages: m.Layout.StripePages, Partition: m.Layout.Partition}
		var ti base.TableInfo
		var err error
		if s.role&roleOperator != 0 {
			ti, err = e.CreateClusterTable(m.Name, int(m.RowBytes), l)
		} else {
			ti, err = e.CreateClusterTableAs(m.Name, int(m.RowBytes), l, s.owner)
		}
		if err != nil {
			return nil, nil, err
		}
		return wireTableInfo(ti), nil, nil
	case *sgio.OpenTable:
		ti, err := e.OpenTable(m.Name)
		if err != nil {
			return nil, nil, err
		}
		return wireTableInfo(ti), nil, nil
	case *sgio.ListTables:
		r := &sgio.TableList{}
		for _, ti := range e.Tables() {
			r.Tables = append(r.Tables, *wireTableInfo(ti))
		}
		return s.fits(r)
	case *sgio.DropTable:
		// No epoch fences a drop: only the identity check keeps a replaced connection's
		// late request from dropping the table of the owner id's new holder.
		if err := s.checkHolder(s.owner); err != nil {
			return nil, nil, err
		}
		if err := s.mayDrop(m.Name); err != nil {
			return nil, nil, err
		}
		if err := s.dropTable(m.Name); err != nil {
			return nil, nil, err
		}
		return &sgio.OK{}, nil, nil
	case *sgio.Acquire:
		if err := s.checkHolder(m.Owner); err != nil {
			return nil, nil, err
		}
		var g base.Grant
		var err error
		if m.Flags&sgio.AcquireEtcdGrant != 0 {
			// Bounded by the engine's GrantVerifyTimeout and its verification slots.
			g, err = e.RegisterGrantFrom(context.Background(), m.Table, m.Owner, m.Epoch, s.id)
		} else {
			g, err = e.AcquireFrom(m.Table, m.Owner, m.Epoch, s.id)
		}
		if err != nil {
			return nil, nil, err
		}
		return &sgio.Grant{Table: g.Table, LeaseMillis: uint32(min(g.Lease.Milliseconds(), 1<<32-1)),
			Owner: g.Owner, Epoch: g.Epoch, LastSeq: g.LastSeq}, nil, nil
	case *sgio.Release:
		if err := s.checkOwner(m.Owner); err != nil {
			return nil, nil, err
		}
		if err := e.ReleaseOwner(m.Owner, s.id); err != nil {
			return nil, nil, err
		}
		return &sgio.OK{}, nil, nil
	case *sgio.AllocIDs:
		if err := s.checkHolder(m.Owner); err != nil {
			return nil, nil, err
		}
		first, count, err := e.AllocIDs(m.Table, m.Owner, m.Epoch, int(m.Pages))
		if err != nil {
			return nil, nil, err
		}
		return &sgio.IDRange{First: first, Count: count}, nil, nil
	case *sgio.ReadPages:
		return s.readPages(m)
	case *sgio.PageDir:
		limit := min(int((s.replyMax-16)/16), storenode.PageDirEntriesMax)
		if m.MaxEntries > 0 {
			limit = min(limit, int(m.MaxEntries))
		}
		if m.Hi < m.Lo {
			return nil, nil, fmt.Errorf("storenode: page directory of [%d, %d): %w", m.Lo, m.Hi, sgio.ErrMalformed)
		}
		pages, next, err := e.PageDirAs(s.owner, m.Table, m.Lo, m.Hi, limit, nil)
		if err != nil {
			return nil, nil, err
		}
		r := &sgio.PageDirReply{Next: next, Entries: make([]sgio.PageEntry, len(pages))}
		if next >= min(m.Hi, logicpage.TablePagesMax) {
			r.Next = m.Hi // the range is done, even beyond the engine's last page
		}
		for i, p := range pages {
			r.Entries[i] = sgio.PageEntry{Page: p.Page, Present: p.Present}
		}
		return r, nil, nil
	case *sgio.Stats:
		return s.fits(s.srv.statsReply())
	case *sgio.TxnDecide, *sgio.TxnApply, *sgio.TxnAsk, *sgio.TxnReport, *sgio.TxnDoubt:
		r, _, err := s.execTxn(m)
		return r, nil, err
	case *sgio.Move:
		r, err := s.execMove(m)
		return r, nil, err
	}
	return nil, nil, fmt.Errorf("storenode: %v: %w", m.Type(), sgio.ErrUnsupported)
}

// fits checks that a reply fits the client's body limit.
func (s *session) fits(m sgio.Message) (sgio.Message, *[]byte, error) {
	if size := m.BodySize(); size > int(s.replyMax) {
		return nil, nil, fmt.Errorf("storenode: %v reply of %d bytes, the client accepts %d: %w", m.Type(), size, s.replyMax, sgio.ErrFrameTooLarge)
	}
	return m, nil, nil
}

func wireTableInfo(ti base.TableInfo) *sgio.TableInfo {
	return &sgio.TableInfo{Table: ti.ID, RowBytes: uint16(ti.RowBytes), NextID: ti.NextID, Name: ti.Name,
		Cluster: base.ClusterLayout{Partitions: ti.Cluster.Partitions, StripePages: ti.Cluster.StripePages, Partition: ti.Cluster.Partition}}
}
