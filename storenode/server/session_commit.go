package server

import (
	"cmp"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/sgio"
)

// The commit path of a session. The event loop validates a Commit's body, checks the queue's
// byte bounds, then copies the body out of gnet's buffer into a pooled buffer and queues it; one commit goroutine per connection (started when the
// queue gets its first commit, gone when it is empty) submits the queue to the engine in
// arrival order. The body is the batch's WAL record as it is (Batch.Body: no re-encoding);
// the engine logs and applies an owner's batches in seq order (holding back a gap),
// acknowledges in LSN order and does not retain a batch or its body once Commit returns (the
// WAL copies the body into its group buffer), so the body goes back to the pool before the
// batch is durable; the reply goes out when the engine reports the outcome, from the WAL's
// goroutine. The copy out of gnet's buffer is unavoidable (gnet reuses it after the turn,
// and the engine runs off the loop); the WAL's copy was kept because writing from the pooled
// body instead (kept until written, pwritev) measured slower over TCP (docs/storage.md).

// commitRequest is a Commit waiting for the connection's commit goroutine; body is a pooled
// copy of the frame's body.
type commitRequest struct {
	id   uint64
	seq  uint64
	body *[]byte
	at   time.Time // arrival on the event loop: the commit latency's start
}

// commit queues a Commit for the connection's commit goroutine, which submits the
// connection's batches to the engine in arrival order. Before anything is copied the body is
// validated (its structure and its owner; a bad one is answered at once) and its size is
// checked against the queue's bounds (MaxQueuedBytes on this connection, MaxQueuedBytesTotal
// on all: over either, ErrBusy); only then is it copied out of the frame, whose bytes are
// gnet's.
func (s *session) commit(f sgio.Frame) {
	v, err := sgio.ViewCommit(f.Body)
	if err == nil {
		err = s.checkOwner(v.Owner)
	}
	if err != nil {
		s.replyRejected(f.ID, err)
		return
	}
	body, ok := s.queueBody(f)
	if !ok {
		return
	}
	s.mu.Lock()
	s.commits = append(s.commits, commitRequest{id: f.ID, seq: v.Seq, body: body, at: time.Now()})
	if !s.committing {
		// Started at the end of the turn (startCommits), so that the goroutine takes all of
		// the turn's commits at once.
		s.committing = true
		s.commitStart = true
	}
	s.mu.Unlock()
}

// startCommits starts the commit goroutine if a commit of this turn asked for it; the loop
// calls it at the end of each turn.
func (s *session) startCommits() {
	if s.commitStart {
		s.commitStart = false
		s.srv.workers.Add(1)
		go s.commitLoopFn() // a method value made once (newSession): no closure per start
	}
}

// commitLoop is the connection's commit goroutine: it runs while commits are queued. At most
// one runs per session (committing), so it owns the session's commitBatch and commitQueue
// while it runs: their slices are reused from one run to the next.
func (s *session) commitLoop() {
	defer s.srv.workers.Done()
	b := &s.commitBatch
	s.mu.Lock()
	queue := s.commitQueue
	s.mu.Unlock()
	for {
		s.mu.Lock()
		if len(s.commits) == 0 {
			s.committing = false
			s.commits, s.commitQueue = queue[:0], s.commits[:0] // reuse both drained slices
			if cap(b.Segments) > commitSegmentsKeep || cap(b.Fences) > commitSegmentsKeep {
				// A large batch's slices are not kept for the session's life.
				b.Segments, b.Fences = nil, nil
			}
			s.mu.Unlock()
			return
		}
		queue, s.commits = s.commits, queue[:0]
		s.mu.Unlock()
		// One connection's batches are one owner's (checkOwner): submitted in seq order, a
		// batch that arrived after a gap it fills goes first, instead of waiting behind the
		// gap (Engine.Commit blocks on a gap for up to SeqGapWait).
		slices.SortStableFunc(queue, compareSeq)
		s.renew()
		for i := range queue {
			s.commitOne(b, queue[i])
			queue[i] = commitRequest{}
		}
	}
}

// commitSegmentsKeep bounds the segments and fences of the session's reused Batch kept
// between runs of its commit goroutine (a 16 MiB body may carry hundreds of thousands).
const commitSegmentsKeep = 256

func compareSeq(a, b commitRequest) int { return cmp.Compare(a.seq, b.seq) }

// commitOne submits one batch. The engine does not retain the batch or its rows once Commit
// returns, so the body goes back to the pool then; the reply is sent when the engine reports
// the outcome.
func (s *session) commitOne(b *base.Batch, req commitRequest) {
	defer func() {
		s.queueRelease(int64(len(*req.body)))
		putCommitBody(req.body)
	}()
	v, err := sgio.ViewCommit(*req.body)
	if err == nil {
		err = s.checkHolder(v.Owner)
	}
	if err != nil {
		s.replyError(req.id, err, true)
		return
	}
	b.Owner, b.Seq, b.Body = v.Owner, v.Seq, *req.body
	b.Fences = b.Fences[:0]
	for i := range v.FenceCount() {
		f := v.Fence(i)
		b.Fences = append(b.Fences, f)
	}
	b.Segments = b.Segments[:0]
	var seg base.Segment
	for it := v.Segments(); it.Next(&seg); {
		if err := s.checkRowSize(&seg); err != nil {
			clear(b.Segments)
			b.Body = nil
			s.replyError(req.id, err, true)
			return
		}
		b.Segments = append(b.Segments, seg)
	}
	a := getCommitAck(s, req.id, v.Seq, req.at)
	s.srv.eng.Commit(b, a.done)
	clear(b.Segments) // drop the references to the body's rows
	b.Body = nil
}

// commitAck is the engine's callback for one submitted batch (Engine.Commit's done), pooled:
// its done is a method value made once with the object, and its CommitAck the reply, which
// reply encodes into the session's Writer before it returns.
type commitAck struct {
	s    *session
	id   uint64
	at   time.Time // the request's arrival: the commit latency's start
	ack  sgio.CommitAck
	done func(lsn uint64, err error)
}

var commitAcks sync.Pool // *commitAck

func getCommitAck(s *session, id, seq uint64, at time.Time) *commitAck {
	a, _ := commitAcks.Get().(*commitAck)
	if a == nil {
		a = &commitAck{}
		a.done = a.finish
	}
	a.s, a.id, a.at, a.ack = s, id, at, sgio.CommitAck{Seq: seq}
	return a
}

// finish replies to the batch's Commit, then goes back to the pool; it runs once, on the
// WAL's goroutine or the commit goroutine (Engine.Commit), and never blocks.
func (a *commitAck) finish(lsn uint64, err error) {
	if err != nil {
		a.s.replyError(a.id, err, true)
	} else {
		a.ack.LSN = lsn
		a.s.srv.commitLatency.Since(a.at)
		a.s.reply(a.id, &a.ack, nil, true)
	}
	*a = commitAck{done: a.done}
	commitAcks.Put(a)
}

// checkRowSize checks that a segment's row size is its table's, clear-only segments
// included: the engine knows a table's row size and checks row counts against it, but the
// segment header's own claim is checked here.
func (s *session) checkRowSize(seg *base.Segment) error {
	rb, err := s.srv.tableRowBytes(seg.Table)
	if err != nil {
		return err
	}
	if int(seg.RowBytes) != rb {
		return fmt.Errorf("storenode: segment of table %d page %d: rows of %d bytes, the table's are %d: %w",
			seg.Table, seg.Page, seg.RowBytes, rb, sgio.ErrBadRowSize)
	}
	return nil
}

// commitBodies pools the copies of Commit bodies.
var commitBodies sync.Pool // *[]byte

// commitBodyKeepMax bounds the bodies kept in the pool.
const commitBodyKeepMax = 1 << 20

// queueBody takes f's body into the request queue's bounds (a busy reply when it would pass
// them) and begins request f.ID; it returns a pooled copy of the body (putCommitBody), or
// false when f was answered or not begun (nothing then stays taken). The loop calls it.
func (s *session) queueBody(f sgio.Frame) (*[]byte, bool) {
	n := int64(len(f.Body))
	if err := s.queueAdd(n); err != nil {
		s.srv.counters.busyReplies.Add(1)
		s.replyError(f.ID, err, false)
		return nil, false
	}
	if !s.begin(f.ID) {
		s.queueRelease(n)
		return nil, false
	}
	body := getCommitBody(len(f.Body))
	copy(*body, f.Body)
	return body, true
}

func getCommitBody(n int) *[]byte {
	if p, ok := commitBodies.Get().(*[]byte); ok && cap(*p) >= n {
		*p = (*p)[:n]
		return p
	}
	// Allocated 8-aligned (as every Go allocation of 8 bytes or more), so rows at 8-aligned
	// offsets of the body are 8-aligned, as the engine's row stores need.
	b := make([]byte, n, max(n, 512))
	return &b
}

func putCommitBody(p *[]byte) {
	if cap(*p) <= commitBodyKeepMax {
		commitBodies.Put(p)
	}
}

// The request queue's bounds: the bodies of a connection's queued commits and of its reads
// waiting for a goroutine, at most MaxQueuedBytes on the connection and MaxQueuedBytesTotal on
// all. Only the loop adds; any goroutine releases.

// queueFull reports ErrBusy when n more bytes would pass either bound, without taking them.
func (s *session) queueFull(n int64) error {
	s.mu.Lock()
	conn := s.queuedBytes
	s.mu.Unlock()
	if conn+n > s.srv.cfg.MaxQueuedBytes {
		return fmt.Errorf("storenode: %d request bytes queued on this connection, %d more would pass the limit %d: %w",
			conn, n, s.srv.cfg.MaxQueuedBytes, sgio.ErrBusy)
	}
	if total := s.srv.queued.Load(); total+n > s.srv.cfg.MaxQueuedBytesTotal {
		return fmt.Errorf("storenode: %d request bytes queued on all connections, the limit %d: %w",
			total, s.srv.cfg.MaxQueuedBytesTotal, sgio.ErrBusy)
	}
	return nil
}

// queueAdd takes n bytes of both bounds, or reports ErrBusy and takes nothing. The loop calls
// it; queueRelease gives them back.
func (s *session) queueAdd(n int64) error {
	if err := s.queueFull(n); err != nil {
		return err
	}
	if total := s.srv.queued.Add(n); total > s.srv.cfg.MaxQueuedBytesTotal {
		s.srv.queued.Add(-n)
		return fmt.Errorf("storenode: %d request bytes queued on all connections, the limit %d: %w",
			total-n, s.srv.cfg.MaxQueuedBytesTotal, sgio.ErrBusy)
	}
	s.mu.Lock()
	s.queuedBytes += n
	s.mu.Unlock()
	return nil
}

// queueRelease gives back n bytes of queueAdd; any goroutine.
func (s *session) queueRelease(n int64) {
	if n == 0 {
		return
	}
	s.mu.Lock()
	s.queuedBytes -= n
	s.mu.Unlock()
	s.srv.queued.Add(-n)
}
