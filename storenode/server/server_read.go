package server

import (
	"fmt"
	"math/bits"
	"slices"
	"strings"
	"sync"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/sgio"
	"github.com/weftdb/weft/storenode"
)

// Reads on the server. A ReadPages whose rows are all in the disk page cache, and at most
// inlineReadMaxBytes of them, is answered on the event loop itself, when the engine's lock is
// free at that instant (Engine.ReadCachedUpTo; it never waits, for the lock or the disk): no
// goroutine, no hand-off, and the reply leaves in the event loop's own write at the end of
// its turn. Every other read of a turn (a miss, a busy engine, a larger read, a PageDir) goes,
// with the turn's other reads, to one goroutine that runs them in order and replies to each
// as it finishes (its bytes reach the loop by AsyncWritev): a slow read delays the reads of
// its own turn only, never commits (they have their own goroutine), later turns nor the
// loop's other connections. (Issue 22, defect 13: cached reads of 16 MiB built on the loop
// delayed its other connections' pings by 80-120 ms.)

// inlineReadMaxBytes bounds the rows a read answered on the event loop copies there.
const inlineReadMaxBytes = 1 << 20

// readInline answers a ReadPages on the loop if the cache holds it; it reports false when the
// request must take the slow path.
func (s *session) readInline(id uint64, m *sgio.ReadPages) bool {
	size := 8
	for _, w := range m.Wants {
		// The rows a reply may carry, at the largest row size; a read that could exceed the
		// client's limit takes the slow path, which computes it exactly.
		size += sgio.SegmentHeaderSize + bits.OnesCount64(w.Want)*sgio.RowBytesMax
		if size > int(s.replyMax) {
			return false
		}
	}
	n := len(m.Wants)
	segs := s.inlineSegs
	if cap(segs) < n {
		segs = make([]base.Segment, n)
		if n <= readWantsKeep {
			s.inlineSegs = segs
		}
	}
	segs = segs[:n]
	buf := getRowBuf()
	rows, ok := s.srv.eng.ReadCachedUpTo(s.owner, m.Wants, segs, (*buf)[:0], inlineReadMaxBytes)
	if !ok {
		clear(segs)
		putRowBuf(buf)
		return false
	}
	*buf = rows
	s.inlineReply.Segments = segs
	s.reply(id, &s.inlineReply, buf, false) // encoded (headers copied, rows gathered) before it returns
	s.inlineReply.Segments = nil
	clear(segs) // drop the references to the rows: the reply owns buf now
	return true
}

// readWantsKeep bounds the wants of the loop's reused ReadPages and segments: a larger request
// gets slices of its own, dropped once answered.
const readWantsKeep = 64

// trimLoopRead drops the wants of a large ReadPages once it is handled, so the loop keeps at
// most readWantsKeep of them between requests.
func (s *session) trimLoopRead() {
	if cap(s.loopRead.Wants) > readWantsKeep {
		s.loopRead.Wants = nil
	}
}

// rowBufs pools the buffers that the rows of Segments replies live in until written
// (session.pendingKeep).
var rowBufs sync.Pool // *[]byte

// rowBufKeepMax bounds the buffers kept in the pool.
const rowBufKeepMax = 1 << 20

// getRowBuf returns an empty pooled buffer.
func getRowBuf() *[]byte {
	if p, ok := rowBufs.Get().(*[]byte); ok {
		return p
	}
	b := make([]byte, 0, 4096)
	return &b
}

// putRowBuf gives back a buffer of getRowBuf once nothing references its bytes.
func putRowBuf(p *[]byte) {
	if cap(*p) <= rowBufKeepMax {
		*p = (*p)[:0]
		rowBufs.Put(p)
	}
}

// readRequest is a read of the slow path, counted in flight.
type readRequest struct {
	id    uint64
	m     sgio.Message
	bytes int64 // its body's bytes, counted in the request queue's bounds (queueAdd)
}

// readTurn is one turn's slow reads, built by the loop and then handed to one goroutine
// (runReads); pooled with its slices, so a turn's hand-off allocates nothing: the goroutine
// starts from a method value made once, and the turn's ReadPages are owned copies of the
// loop's (ownedRead) in messages the turn reuses.
type readTurn struct {
	s     *session
	reads []readRequest
	msgs  []*sgio.ReadPages // the turn's copies; the first used of them in use
	used  int
	reply sgio.Segments // the reply being built: encoded (replyReserved) before the next
	run   func()        // t.runReads
}

var readTurns sync.Pool // *readTurn

// readTurnKeep bounds the reads and messages a pooled turn keeps.
const readTurnKeep = 64

// turn returns the current turn's slow reads, taking a pooled turn at the turn's first; only
// the loop calls it.
func (s *session) turn() *readTurn {
	if s.turnReads == nil {
		t, _ := readTurns.Get().(*readTurn)
		if t == nil {
			t = &readTurn{}
		}
		if t.run == nil {
			t.run = t.runReads
		}
		t.s = s
		s.turnReads = t
	}
	return s.turnReads
}

// ownedRead copies the loop's ReadPages for a read that leaves the loop (the loop parses the
// next request into loopRead).
func (t *readTurn) ownedRead(src *sgio.ReadPages) *sgio.ReadPages {
	if t.used == len(t.msgs) {
		t.msgs = append(t.msgs, &sgio.ReadPages{})
	}
	m := t.msgs[t.used]
	t.used++
	m.Wants = append(m.Wants[:0], src.Wants...)
	return m
}

// runReads runs a turn's slow reads in order on one goroutine, replying to each, then puts the
// turn back in the pool. Before each read it reserves room for its reply (reserveRoom): a
// connection holds a bounded amount of replies, whatever number of turns' goroutines build
// them at once.
func (t *readTurn) runReads() {
	s, reads := t.s, t.reads
	defer s.srv.workers.Done()
	defer t.release()
	s.renew()
	for i, r := range reads {
		reads[i] = readRequest{} // answered: the message goes back with the turn
		size := s.replySizeBound(r.m)
		if !s.reserveRoom(size) {
			s.queueRelease(r.bytes)
			s.endRequests(1) // closed: no reply will go out
			continue
		}
		if h := s.srv.cfg.readHook; h != nil {
			h(r.m)
		}
		var reply sgio.Message
		var keep *[]byte
		var err error
		if m, ok := r.m.(*sgio.ReadPages); ok {
			reply, keep, err = s.readPagesInto(m, &t.reply)
		} else {
			reply, keep, err = s.exec(r.m)
		}
		s.queueRelease(r.bytes)
		s.replyReserved(r.id, reply, keep, err, size)
		clear(t.reply.Segments) // encoded: drop the references to the rows
	}
}

// release puts a turn whose reads are answered back in the pool, without what a large turn
// grew.
func (t *readTurn) release() {
	t.s = nil
	t.reads = t.reads[:0]
	if cap(t.reads) > readTurnKeep {
		t.reads = nil
	}
	for _, m := range t.msgs[:t.used] {
		if cap(m.Wants) > readWantsKeep {
			m.Wants = nil
		}
	}
	if len(t.msgs) > readTurnKeep {
		clear(t.msgs[readTurnKeep:])
		t.msgs = t.msgs[:readTurnKeep]
	}
	t.used = 0
	t.reply.Segments = t.reply.Segments[:0]
	if cap(t.reply.Segments) > readWantsKeep {
		t.reply.Segments = nil
	}
	readTurns.Put(t)
}

// smallReplyBound bounds the frame of a reply that is neither rows, a page directory nor a
// table list: an Error (its message is at most sgio.ErrorMessageMax), StatsReply, TableInfo,
// Grant, IDRange, OK, Pong.
const smallReplyBound = 4 << 10

// tableInfoBodyMax is the largest TableInfo in a TableList: a name of sgio.NameMax bytes and
// a cluster layout.
var tableInfoBodyMax = (&sgio.TableInfo{Name: strings.Repeat("n", sgio.NameMax), Cluster: base.ClusterLayout{Partitions: 1}}).BodySize()

// replySizeBound bounds the reply to a request answered by a goroutine, reserved before the
// reply is built (reserveRoom): a ReadPages's rows that exist now (more rows inserted
// meanwhile are few, and the reply limit still holds), a PageDir's entries, a TableList's
// tables now (at their longest name), at least smallReplyBound for any.
func (s *session) replySizeBound(m sgio.Message) int64 {
	switch m := m.(type) {
	case *sgio.ReadPages:
		rows, err := s.srv.eng.PresentRowsSize(m.Wants)
		if err != nil {
			return smallReplyBound // answered with the error
		}
		return int64(8 + len(m.Wants)*sgio.SegmentHeaderSize + rows)
	case *sgio.PageDir:
		return int64(16 + 16*min(int((s.replyMax-16)/16), storenode.PageDirEntriesMax))
	case *sgio.ListTables:
		return int64(max(sgio.HeaderSize+8+s.srv.eng.TableCount()*tableInfoBodyMax, smallReplyBound))
	}
	return smallReplyBound
}

// readPages answers a ReadPages request: one segment per wanted page, in order, with only the
// wanted rows that exist. The rows are gathered into one buffer that the reply keeps until it
// is written; it is sized by the rows that exist, not the rows asked for, so a request for an
// empty range costs its segment headers only.
func (s *session) readPages(m *sgio.ReadPages) (sgio.Message, *[]byte, error) {
	return s.readPagesInto(m, &sgio.Segments{})
}

// readPagesInto is readPages building its reply in reply, whose segments it reuses.
func (s *session) readPagesInto(m *sgio.ReadPages, reply *sgio.Segments) (sgio.Message, *[]byte, error) {
	rowsSize, err := s.srv.eng.PresentRowsSize(m.Wants)
	if err != nil {
		return nil, nil, err
	}
	size := 8 + len(m.Wants)*sgio.SegmentHeaderSize + rowsSize
	if size > int(s.replyMax) {
		return nil, nil, fmt.Errorf("storenode: ReadPages of %d pages answers %d bytes, the client accepts %d: %w",
			len(m.Wants), size, s.replyMax, sgio.ErrFrameTooLarge)
	}
	reply.Segments = slices.Grow(reply.Segments[:0], len(m.Wants))[:len(m.Wants)]
	buf := getRowBuf()
	rows := slices.Grow((*buf)[:0], rowsSize)
	for i, w := range m.Wants {
		rb, err := s.srv.tableRowBytes(w.Table)
		if err != nil {
			putRowBuf(buf)
			return nil, nil, err
		}
		start := len(rows)
		data, clear, out, err := s.srv.eng.ReadRowsAs(s.owner, w.Table, w.Page, w.Want, rows)
		if err != nil {
			putRowBuf(buf)
			return nil, nil, err
		}
		rows = out
		reply.Segments[i] = base.Segment{Table: w.Table, RowBytes: uint16(rb), Page: w.Page, Data: data, Clear: clear,
			Rows: rows[start:len(rows):len(rows)]}
	}
	if size := 8 + len(m.Wants)*sgio.SegmentHeaderSize + len(rows); size > int(s.replyMax) {
		// Rows were inserted since they were counted.
		putRowBuf(buf)
		return nil, nil, fmt.Errorf("storenode: ReadPages of %d pages answers %d bytes, the client accepts %d: %w",
			len(m.Wants), size, s.replyMax, sgio.ErrFrameTooLarge)
	}
	*buf = rows
	return reply, buf, nil
}

// reserveRoom waits, on a request goroutine, until the session's replies held (produced,
// not yet handed to the transport) plus those reserved by reads being built leave room for
// size more bytes under connReplyMaxBytes, then reserves them; false when the session closed
// meanwhile. A reply larger than the bound still goes once nothing else is held or reserved,
// so what a connection holds stays below connReplyMaxBytes plus one reply, however many read
// goroutines it has. The caller gives the reservation back as it queues its reply
// (replyReserved, under the lock that queues it: the bytes are never counted twice), or with
// releaseRoom.
func (s *session) reserveRoom(size int64) bool {
	for {
		s.mu.Lock()
		if s.isClosed {
			s.mu.Unlock()
			return false
		}
		held := s.pending.Len() + s.sending.Len() + s.reserved
		if held == 0 || held+size <= connReplyMaxBytes {
			s.reserved += size
			s.mu.Unlock()
			return true
		}
		if s.room == nil {
			s.room = make(chan struct{})
		}
		ch := s.room
		s.mu.Unlock()
		<-ch
	}
}

// releaseRoom gives back a reservation of reserveRoom.
func (s *session) releaseRoom(size int64) {
	s.mu.Lock()
	s.reserved -= size
	s.signalRoomLocked()
	s.mu.Unlock()
}
