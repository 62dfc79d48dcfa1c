package wal

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weftdb/weft/internal/assert"
	"github.com/weftdb/weft/internal/vfs"
)

// lockFileName is the file in the WAL directory that Open locks, so that a second WAL (in
// this process or another) cannot write the same log.
const lockFileName = "LOCK"

// WAL is an open write-ahead log. Its methods may be called from any goroutine, except that
// the done callbacks of AppendAsync, which run on the writer goroutine, must not call Append,
// Sync, DropBefore or Close (they would wait for the writer that runs them).
type WAL struct {
	// Invariants (mu guards the fields it names):
	//   - LSNs are consecutive: the queue holds nextLSN-len(queue) .. nextLSN-1 in order,
	//     and queueBuf holds their encoded records back to back, at queued.off.
	//   - syncedThrough <= writtenLSN <= nextLSN-1; records up to syncedThrough are durable.
	//   - Only the writer goroutine touches file, fileFirst, fileOff, allocEnd, writtenLSN,
	//     failed and the group buffers; it calls every done callback, in LSN order, exactly
	//     once.
	//   - Once err is set it never changes, nothing is queued again and no record is
	//     acknowledged after it.

	fs   vfs.FS
	dir  string
	opts Options
	lock io.Closer

	mu       sync.Mutex
	nextLSN  uint64   // guarded by mu: the LSN of the next queued record
	queue    []queued // guarded by mu: records waiting for the writer, in LSN order
	queueBuf []byte   // guarded by mu: their encoded records, but for the kept pieces
	// queueRefs (guarded by mu) are the kept pieces of the queued records (AppendPiecesAsync),
	// in order: each is written at its offset of queueBuf, before the byte there.
	queueRefs     []ref
	queueRefBytes int           // guarded by mu: the bytes of queueRefs
	syncWanted    bool          // guarded by mu: a Sync call waits for a sync
	closing       bool          // guarded by mu: Close has begun; nothing is queued any more
	err           error         // guarded by mu: the sticky fail-stop error
	segs          []uint64      // guarded by mu: first LSNs of the segment files; last is active
	spaceFreed    chan struct{} // guarded by mu: closed when the writer takes the queue, if watched
	// spaceWatched (guarded by mu) says someone waits on spaceFreed (ErrBusy, Room), so the
	// writer closes and replaces it; a group nobody waits for allocates no channel.
	spaceWatched bool
	// gatherAt (guarded by mu), when > 0, asks enqueue to wake the gathering writer once
	// the queue holds that many records.
	gatherAt int
	synced   sync.Cond // on mu: broadcast after every group, on failure and on exit

	wake   chan struct{} // capacity 1: the queue became non-empty, or Sync or Close asks
	exited chan struct{} // closed when the writer goroutine returns
	dropMu sync.Mutex    // serialises DropBefore

	lastLSN       atomic.Uint64 // nextLSN-1, readable without mu
	syncedThrough atomic.Uint64 // written by the writer only

	// Owned by the writer goroutine.
	file       vfs.File
	fileFirst  uint64
	fileOff    int64
	allocEnd   int64 // the active segment's blocks are reserved up to here (preallocate)
	writtenLSN uint64
	failed     bool
	group      []queued
	groupBuf   []byte
	groupRefs  []ref
	iov        [][]byte // the gather list of a group with kept pieces
	// Group gathering (SyncAlways): the next group waits for gatherTarget records, at most
	// gatherWait (gather).
	gatherTarget int
	gatherWait   time.Duration
	gatherTimer  *time.Timer

	records, bytes, groups, syncs atomic.Uint64

	closeOnce sync.Once
	closeErr  error
}

// ref is a kept piece of a queued record: written from the appender's memory, before the
// byte at offset at of the queue buffer.
type ref struct {
	at int
	b  []byte
}

// Piece is one part of a record's payload for AppendPiecesAsync. A piece with Keep is written
// from the caller's memory (a gather list, no copy): its bytes must not change until the
// record's done callback has run. Any other piece is copied during the call.
type Piece struct {
	Bytes []byte
	Keep  bool
}

// queued is a record waiting for the writer.
type queued struct {
	lsn   uint64
	off   int // offset of the encoded record in the queue buffer
	force bool
	done  func(lsn uint64, err error)
}

// Open locks the directory dir (creating it), recovers the log in it and starts the writer.
//
// Recovery reads the segments in order and hands every good record with LSN > opts.After to
// replay (nil: no replay), in LSN order, on the calling goroutine. At the first bad record it
// decides between a torn tail (a crash cut the unsynced end: the log is truncated there and
// appends continue after the last good record) and corruption (a later valid record says the
// bad one had been synced: Open fails with an error wrapping corrupt.ErrCorruption that names
// the file and offset, and changes nothing). If Open fails, the caller must discard whatever
// replay received. An error from replay stops Open and is returned wrapped.
func Open(fsys vfs.FS, dir string, opts Options, replay func(Record) error) (*WAL, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := fsys.MkdirAll(dir); err != nil {
		return nil, fmt.Errorf("wal: open %s: %w", dir, err)
	}
	// The directory's own entry (and its parents', if MkdirAll made them, now or in a run
	// that crashed) must be durable before anything in it is.
	for d := dir; ; {
		parent := path.Dir(d)
		if err := fsys.SyncDir(parent); err != nil {
			return nil, fmt.Errorf("wal: open %s: sync dir %s: %w", dir, parent, err)
		}
		if parent == d || parent == "." || parent == "/" {
			break
		}
		d = parent
	}
	lock, err := fsys.Lock(path.Join(dir, lockFileName))
	if err != nil {
		return nil, fmt.Errorf("wal: open %s: %w", dir, err)
	}
	w := &WAL{
		fs:         fsys,
		dir:        dir,
		opts:       opts,
		lock:       lock,
		spaceFreed: make(chan struct{}),
		wake:       make(chan struct{}, 1),
		exited:     make(chan struct{}),
	}
	w.gatherTimer = time.NewTimer(time.Hour)
	w.gatherTimer.Stop()
	w.synced.L = &w.mu
	if err := w.recover(replay); err != nil {
		if w.file != nil {
			_ = w.file.Close()
		}
		_ = lock.Close()
		return nil, err
	}
	go w.run()
	return w, nil
}

// AppendAsync queues a record of the given kind whose payload is the concatenation of the
// slices of payload, and returns at once. The payload is copied during the call: the caller
// may reuse its slices when AppendAsync returns.
//
// When AppendAsync returns nil, done is called exactly once, on the writer goroutine, with
// the record's LSN and nil after the record was written (and synced, with SyncAlways or
// force), or with an error wrapping ErrFailStop if it could not be: then the record is not
// acknowledged and may or may not be found after a reopen. Callbacks are called in LSN
// order; they must be quick and must not call Append, Sync, DropBefore or Close (AppendAsync
// is allowed). force=true syncs the record in every sync mode (id grants).
//
// When AppendAsync returns an error, the record was not queued and done is not called:
// ErrTooLarge, ErrBusy (the queue holds MaxQueueBytes: take Room() before the call and wait
// on it, or use Append, which waits), ErrClosed, or the sticky fail-stop error. LSNs of
// records that failed are not reused before a reopen.
func (w *WAL) AppendAsync(kind byte, payload [][]byte, force bool, done func(lsn uint64, err error)) error {
	assert.That(done != nil, "wal: AppendAsync without done")
	_, err := w.enqueue(kind, payload, nil, force, done)
	return err
}

// AppendPiecesAsync is AppendAsync with a payload of pieces, some of which the WAL keeps
// rather than copies: a Piece with Keep is written from the caller's memory, which must not
// change until done has run (even when the record fails: done is the only release). Use it
// for large payloads that stay alive anyway until their record is acknowledged (a commit
// batch's received body or its rows); small pieces are cheaper copied.
func (w *WAL) AppendPiecesAsync(kind byte, payload []Piece, force bool, done func(lsn uint64, err error)) error {
	assert.That(done != nil, "wal: AppendPiecesAsync without done")
	_, err := w.enqueue(kind, nil, payload, force, done)
	return err
}

// Append appends a record like AppendAsync and waits until it is written (and synced, with
// SyncAlways or force), returning its LSN. It waits for room in the queue rather than
// return ErrBusy. If ctx has ended before the call or ends while waiting for room, Append
// returns ctx.Err() and the record was not appended; if ctx ends after the record was queued, Append returns an error
// wrapping ErrUnknownOutcome and ctx.Err(): the record may still become durable.
func (w *WAL) Append(ctx context.Context, kind byte, payload [][]byte, force bool) (uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	wt := waiterPool.Get().(*waiter)
	for {
		spaceFreed, err := w.enqueue(kind, payload, nil, force, wt.done)
		if err == nil {
			break
		}
		if !errors.Is(err, ErrBusy) {
			waiterPool.Put(wt)
			return 0, err
		}
		select {
		case <-spaceFreed:
		case <-ctx.Done():
			waiterPool.Put(wt)
			return 0, ctx.Err()
		}
	}
	select {
	case r := <-wt.ch:
		waiterPool.Put(wt)
		return r.lsn, r.err
	case <-ctx.Done():
		// wt stays with the writer, which will send to it: it is not reused.
		return 0, fmt.Errorf("%w: %w", ErrUnknownOutcome, ctx.Err())
	}
}

// waiter carries the outcome of one blocking Append from the writer goroutine.
type waiter struct {
	ch   chan waitResult // capacity 1, so the writer never blocks on it
	done func(lsn uint64, err error)
}

type waitResult struct {
	lsn uint64
	err error
}

var waiterPool = sync.Pool{New: func() any {
	wt := &waiter{ch: make(chan waitResult, 1)}
	wt.done = func(lsn uint64, err error) { wt.ch <- waitResult{lsn, err} }
	return wt
}}

// enqueue encodes the record, whose payload is copies or pieces, into the queue. With ErrBusy
// it returns the channel that is closed when the writer next takes the queue.
func (w *WAL) enqueue(kind byte, copies [][]byte, pieces []Piece, force bool, done func(uint64, error)) (chan struct{}, error) {
	n, kept := payloadBytes(copies, pieces)
	if n > w.opts.MaxRecordBytes {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, n, w.opts.MaxRecordBytes)
	}
	size := recordSize(n)
	w.mu.Lock()
	queuedBytes := len(w.queueBuf) + w.queueRefBytes
	if ch, err := w.admitLocked(queuedBytes, size); err != nil {
		w.mu.Unlock()
		return ch, err
	}
	wasEmpty := len(w.queue) == 0
	w.putLocked(kind, copies, pieces, n, kept, force, done)
	gathered := w.gatherAt > 0 && len(w.queue) >= w.gatherAt
	assert.That(queuedBytes+size <= w.opts.MaxQueueBytes || len(w.queue) == 1, "wal: queue over its bound")
	w.mu.Unlock()
	if wasEmpty || gathered {
		w.signal()
	}
	return nil, nil
}

// payloadBytes returns the length of a payload of copies or pieces, and how much of it is
// kept pieces.
func payloadBytes(copies [][]byte, pieces []Piece) (n, kept int) {
	for _, p := range copies {
		n += len(p)
	}
	for _, p := range pieces {
		n += len(p.Bytes)
		if p.Keep {
			kept += len(p.Bytes)
		}
	}
	return n, kept
}

// admitLocked says whether size more bytes of records may be queued behind queuedBytes: nil,
// or ErrClosed, the sticky error, or ErrBusy with the channel closed when the writer next
// takes the queue. Called with mu held.
func (w *WAL) admitLocked(queuedBytes, size int) (chan struct{}, error) {
	switch {
	case w.closing:
		return nil, ErrClosed
	case w.err != nil:
		return nil, w.err
	case queuedBytes > 0 && queuedBytes+size > w.opts.MaxQueueBytes:
		w.spaceWatched = true
		return w.spaceFreed, ErrBusy
	}
	return nil, nil
}

// putLocked encodes one admitted record of n payload bytes (kept of them in kept pieces) at
// the end of the queue, with the next LSN. Called with mu held.
func (w *WAL) putLocked(kind byte, copies [][]byte, pieces []Piece, n, kept int, force bool, done func(uint64, error)) {
	size := recordSize(n)
	lsn := w.nextLSN
	w.nextLSN++
	off := len(w.queueBuf)
	inline := size - kept
	w.queueBuf = slices.Grow(w.queueBuf, inline)[:off+inline]
	rec := w.queueBuf[off:]
	putRecordHeader(rec, n, lsn, kind)
	at := recordHeaderSize // of rec
	for _, p := range copies {
		at += copy(rec[at:], p)
	}
	for _, p := range pieces {
		if p.Keep {
			if len(p.Bytes) > 0 {
				w.queueRefs = append(w.queueRefs, ref{at: off + at, b: p.Bytes})
			}
			continue
		}
		at += copy(rec[at:], p.Bytes)
	}
	w.queueRefBytes += kept
	clear(rec[at:]) // padding
	w.queue = append(w.queue, queued{lsn: lsn, off: off, force: force, done: done})
	assert.That(w.queue[0].lsn+uint64(len(w.queue))-1 == lsn, "wal: queue LSNs not consecutive")
	w.lastLSN.Store(lsn)
}

// signal wakes the writer goroutine if it waits.
func (w *WAL) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// Sync makes every record appended before the call durable, in every sync mode, and
// returns nil once it is (the checkpoint calls it before publishing). It returns the sticky
// fail-stop error if the WAL has failed, ErrClosed after Close has begun.
func (w *WAL) Sync() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	target := w.nextLSN - 1
	for {
		switch {
		case w.err != nil:
			return w.err
		case w.closing:
			return ErrClosed
		case w.syncedThrough.Load() >= target:
			return nil
		}
		w.syncWanted = true
		w.signal()
		w.synced.Wait()
	}
}

// SyncedThrough returns the highest LSN known durable: every record up to it survives power
// loss.
func (w *WAL) SyncedThrough() uint64 { return w.syncedThrough.Load() }

// LastLSN returns the LSN of the last record appended (queued), written or not: the next
// record gets LastLSN()+1. After Open it is the last recovered LSN (0 for a new log).
func (w *WAL) LastLSN() uint64 { return w.lastLSN.Load() }

// DropBefore deletes the segment files whose records all have LSNs below lsn (never the
// active one) and syncs the directory. Records with LSN >= lsn stay. The checkpoint calls
// DropBefore(checkpointLSN+1) after it has published. Segments are removed oldest first, so
// a crash in between leaves a contiguous log.
func (w *WAL) DropBefore(lsn uint64) error {
	w.dropMu.Lock()
	defer w.dropMu.Unlock()
	w.mu.Lock()
	segs := slices.Clone(w.segs)
	w.mu.Unlock()
	n := 0
	for n+1 < len(segs) && segs[n+1] <= lsn {
		n++
	}
	if n == 0 {
		return nil
	}
	var err error
	removed := 0
	for ; removed < n; removed++ {
		if err = w.fs.Remove(path.Join(w.dir, segmentName(segs[removed]))); err != nil {
			err = fmt.Errorf("wal: drop segment %s: %w", segmentName(segs[removed]), err)
			break
		}
	}
	if removed > 0 {
		w.mu.Lock()
		assert.That(w.segs[0] == segs[0], "wal: segment list changed under DropBefore")
		w.segs = w.segs[removed:]
		w.mu.Unlock()
		if errSync := w.fs.SyncDir(w.dir); errSync != nil && err == nil {
			err = fmt.Errorf("wal: drop segments: sync dir %s: %w", w.dir, errSync)
		}
	}
	return err
}

// Stats returns the counters since Open.
func (w *WAL) Stats() Stats {
	s := Stats{
		Records: w.records.Load(),
		Bytes:   w.bytes.Load(),
		Groups:  w.groups.Load(),
		Syncs:   w.syncs.Load(),
	}
	if s.Syncs > 0 {
		s.RecordsPerSync = float64(s.Records) / float64(s.Syncs)
	}
	return s
}

// Close writes the records already queued, syncs them, closes the files and releases the
// directory lock. Appends after Close has begun fail with ErrClosed. Close is idempotent:
// every call returns the same result, the sticky fail-stop error if the WAL failed (so a
// caller learns that unsynced records may be lost), else the first error of closing.
func (w *WAL) Close() error {
	w.closeOnce.Do(func() {
		w.mu.Lock()
		w.closing = true
		w.mu.Unlock()
		w.signal()
		<-w.exited
		var errFile error
		if w.file != nil {
			errFile = w.file.Close()
		}
		errLock := w.lock.Close()
		w.mu.Lock()
		sticky := w.err
		w.mu.Unlock()
		switch {
		case sticky != nil:
			w.closeErr = sticky
		case errFile != nil:
			w.closeErr = fmt.Errorf("wal: close: %w", errFile)
		case errLock != nil:
			w.closeErr = fmt.Errorf("wal: close: unlock: %w", errLock)
		}
	})
	return w.closeErr
}
