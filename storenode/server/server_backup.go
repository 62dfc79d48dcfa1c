package server

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weftdb/weft/sgio"
	"github.com/weftdb/weft/storenode"
)

// Online backup over the wire (sgio.Backup, sgio.BackupChunk; docs/wire.md). The client pulls
// the backup one piece per request. Engine.Backup runs on a goroutine of its own (never on the
// event loop) with a sink that hands each piece to the request goroutine that pulls it and
// waits until that goroutine has queued the piece's reply (the session's writer copies the
// bytes), so a backup holds at most one piece of the engine's and one reply in the session's
// bounded output (reserveRoom) at a time: a client that reads slowly slows the backup down,
// a client that stops reading stops it, and one that goes away (connection closed, idle
// timeout) abandons it: the backup's context is cancelled and its hold on the snapshot
// released.
//
// Invariants (backupConn.mu guards the fields it names):
//   - A connection runs at most one backup (stream != 0 while it runs) and serves at most one
//     Backup request at a time (pulling): a second one in flight gets ErrBusy, a Backup with
//     another stream ErrMalformed.
//   - cur is the piece being handed out, pos how much of it the replies queued so far took;
//     the engine's sink waits on cur.taken, closed once pos reaches its end (or the
//     connection closed).

// backupConn is a session's backup state; the zero value is idle.
type backupConn struct {
	mu      sync.Mutex
	stream  uint64 // guarded by mu: the running backup's id, 0 when none
	pulling bool   // guarded by mu: a Backup request is being served
	closed  bool   // guarded by mu: the connection is gone
	cancel  context.CancelFunc
	pieces  chan *backupPiece // the sink's hand-off, unbuffered
	done    chan struct{}     // closed when Engine.Backup returned; info and err set before
	info    storenode.BackupInfo
	err     error
	cur     *backupPiece // guarded by mu: the piece being handed out
}

// backupPiece is one WriteChunk of the engine, aliasing its buffer until taken is closed.
type backupPiece struct {
	f     storenode.BackupFile
	off   int64
	b     []byte
	pos   int
	taken chan struct{}
}

// backupStreams numbers backups across the server's connections, so a Backup naming another
// connection's stream is refused.
var backupStreams atomic.Uint64

// backupRequest dispatches a Backup request on the loop: parsed, counted in flight and
// handed to a goroutine (runBackup). f.Body is valid during the call only.
func (s *session) backupRequest(f sgio.Frame) {
	var m sgio.Backup
	if err := m.Parse(f.Body); err != nil {
		s.replyRejected(f.ID, err)
		return
	}
	if !s.begin(f.ID) {
		return
	}
	s.srv.workers.Add(1)
	go s.runBackup(f.ID, m)
}

// runBackup answers one Backup request with the backup's next piece (or its end, or its
// error), on its own goroutine.
func (s *session) runBackup(id uint64, m sgio.Backup) {
	defer s.srv.workers.Done()
	chunk := int(m.ChunkMax)
	if chunk == 0 || chunk > storenode.BackupChunkMax {
		chunk = storenode.BackupChunkMax
	}
	// The reply must fit the client's body limit: 32 bytes of header fields, then the data.
	chunk = min(chunk, (int(s.replyMax)-32)&^7)
	if chunk < 4096 {
		s.replyError(id, fmt.Errorf("storenode: backup pieces of %d bytes: the client accepts too small replies (%d bytes): %w",
			chunk, s.replyMax, sgio.ErrFrameTooLarge), true)
		return
	}
	size := int64(sgio.HeaderSize + 32 + chunk)
	if !s.reserveRoom(size) {
		s.endRequests(1) // closed: no reply will go out
		return
	}
	s.renew()
	c := &s.backup
	reply, n, pulled, err := c.next(s, m.Stream, chunk)
	s.replyReserved(id, reply, nil, err, size)
	if pulled {
		c.taken(n) // only the request that pulled: a refused one leaves the puller's flag alone
	}
}

// next returns the reply to a Backup request for stream (0: start one), how many bytes of
// the current piece it carries, and whether the request pulled (set pulling: the caller
// calls taken after queueing the reply) or was refused before.
func (c *backupConn) next(s *session, stream uint64, chunk int) (*sgio.BackupChunk, int, bool, error) {
	c.mu.Lock()
	switch {
	case c.closed:
		c.mu.Unlock()
		return nil, 0, false, fmt.Errorf("storenode: backup: connection closed: %w", sgio.ErrConnClosed)
	case c.pulling:
		c.mu.Unlock()
		return nil, 0, false, fmt.Errorf("storenode: backup: one Backup request at a time on a connection: %w", sgio.ErrBusy)
	case stream == 0 && c.stream != 0:
		c.mu.Unlock()
		return nil, 0, false, fmt.Errorf("storenode: backup: this connection runs a backup already: %w", sgio.ErrBusy)
	case stream != 0 && stream != c.stream:
		c.mu.Unlock()
		return nil, 0, false, fmt.Errorf("storenode: backup: no backup %d on this connection: %w", stream, sgio.ErrMalformed)
	}
	if stream == 0 {
		c.start(s.srv.eng)
	}
	c.pulling = true
	stream, pieces, done, p := c.stream, c.pieces, c.done, c.cur
	c.mu.Unlock()

	if p == nil {
		select {
		case p = <-pieces:
			c.mu.Lock()
			c.cur = p
			c.mu.Unlock()
		case <-done:
			reply, err := c.end(stream)
			return reply, 0, true, err
		}
	}
	n := min(chunk, len(p.b)-p.pos)
	return &sgio.BackupChunk{Stream: stream, Kind: uint8(p.f.Kind), Num: p.f.Num, Offset: uint64(p.off) + uint64(p.pos),
		Data: p.b[p.pos : p.pos+n]}, n, true, nil
}

// start runs Engine.Backup on its own goroutine. Caller holds mu.
func (c *backupConn) start(e *storenode.Engine) {
	ctx, cancel := context.WithCancel(context.Background())
	c.stream = backupStreams.Add(1)
	c.cancel = cancel
	c.pieces = make(chan *backupPiece)
	c.done = make(chan struct{})
	done, pieces := c.done, c.pieces
	go func() {
		info, err := e.Backup(ctx, backupHandoff{c: c, pieces: pieces})
		c.mu.Lock()
		c.info, c.err = info, err
		c.mu.Unlock()
		close(done)
	}()
}

// end answers the request that found the backup finished, and makes the connection idle.
func (c *backupConn) end(stream uint64) (*sgio.BackupChunk, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	info, err := c.info, c.err
	c.stream, c.pieces, c.done = 0, nil, nil
	c.cancel()
	if err != nil {
		if errors.Is(err, context.Canceled) {
			err = fmt.Errorf("storenode: backup abandoned: %w", sgio.ErrConnClosed)
		}
		return nil, err
	}
	return &sgio.BackupChunk{Stream: stream, Kind: sgio.BackupKindEnd, Num: info.CheckpointLSN, Offset: info.ThroughLSN, Data: []byte{}}, nil
}

// taken records that the reply to the current request, carrying n bytes of the current
// piece, was queued: a piece wholly handed out lets the engine go on. The next request may
// pull once it returns.
func (c *backupConn) taken(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pulling = false
	p := c.cur
	if p == nil {
		return
	}
	p.pos += n
	if p.pos >= len(p.b) {
		c.cur = nil
		close(p.taken)
	}
}

// abandon ends the connection's backup: its context is cancelled, so Engine.Backup returns
// and releases its hold. Called once the connection closed, from any goroutine.
func (c *backupConn) abandon() {
	c.mu.Lock()
	c.closed = true
	cancel := c.cancel
	c.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

// backupHandoff is the engine's sink of a wire backup: it hands each piece to the pulling
// request and waits until its replies are queued.
type backupHandoff struct {
	c      *backupConn
	pieces chan *backupPiece
}

// progress reports how much of p the replies took so far.
func (h backupHandoff) progress(p *backupPiece) int {
	h.c.mu.Lock()
	defer h.c.mu.Unlock()
	return p.pos
}

// backupPullWaitMax is how long a backup waits for its client's next Backup request: a client
// that stops asking (but keeps its connection alive) abandons the backup after it, instead
// of holding the snapshot for Options.BackupTimeout. A variable for tests only.
var backupPullWaitMax = time.Minute

// WriteChunk hands b over (BackupSink).
func (h backupHandoff) WriteChunk(ctx context.Context, f storenode.BackupFile, off int64, b []byte) error {
	p := &backupPiece{f: f, off: off, b: b, taken: make(chan struct{})}
	wait := time.NewTimer(backupPullWaitMax)
	defer wait.Stop()
	select {
	case h.pieces <- p:
	case <-ctx.Done():
		return ctx.Err()
	case <-wait.C:
		return fmt.Errorf("%w: the client asked for no piece for %v", storenode.ErrBackupTimeout, backupPullWaitMax)
	}
	// A piece larger than the client's chunk takes several requests: the same bound holds
	// for each of them.
	for pos := 0; ; {
		wait.Reset(backupPullWaitMax)
		select {
		case <-p.taken:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-wait.C:
			if now := h.progress(p); now != pos {
				pos = now
				continue
			}
			return fmt.Errorf("%w: the client asked for no piece for %v", storenode.ErrBackupTimeout, backupPullWaitMax)
		}
	}
}
