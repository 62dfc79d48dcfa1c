package wal

import (
	"encoding/binary"
	"fmt"
	"io"
	"path"
	"runtime"
	"time"

	"github.com/weftdb/weft/internal/assert"
	"github.com/weftdb/weft/internal/checksum"
	"github.com/weftdb/weft/internal/vfs"
)

// The writer goroutine: it takes every record queued while the previous group was written
// and synced (with SyncAlways, after gathering the appenders that group acknowledged, see
// gather), writes them with one WriteAt, syncs once if the sync mode or any record asks,
// then calls the done callbacks in LSN order. Everything here runs on that goroutine.

// groupBufKeepBytes is the capacity of a group buffer kept for reuse after a group that used
// less than a quarter of it; a larger buffer (after a burst of big records) is released.
const groupBufKeepBytes = 4 << 20

// preallocStep is how far ahead of the write position the active segment's blocks are
// reserved (preallocate): an empty log takes this much disk, not a whole segment.
const preallocStep = 4 << 20

// run is the writer goroutine's loop.
func (w *WAL) run() {
	defer close(w.exited)
	for {
		w.mu.Lock()
		for len(w.queue) == 0 && !w.syncWanted && !w.closing {
			w.mu.Unlock()
			<-w.wake
			w.mu.Lock()
		}
		switch {
		case len(w.queue) == 0 || w.closing || w.syncWanted:
		case len(w.queue) < w.gatherTarget && w.gatherWait > 0:
			w.gather()
		case !w.opts.noYield:
			// Let the batch build: appenders that are about to queue get one scheduling
			// round before the group is cut, which raises records per write and sync
			// when the previous group finished quickly (SyncNone, a fast disk).
			w.mu.Unlock()
			runtime.Gosched()
			w.mu.Lock()
		}
		group, buf, refs := w.queue, w.queueBuf, w.queueRefs
		w.queue, w.queueBuf, w.queueRefs = w.group[:0], w.groupBuf[:0], w.groupRefs[:0]
		w.queueRefBytes = 0
		syncWanted, closing := w.syncWanted, w.closing
		w.syncWanted = false
		if len(group) > 0 && w.spaceWatched {
			close(w.spaceFreed)
			w.spaceFreed = make(chan struct{})
			w.spaceWatched = false
		}
		w.mu.Unlock()

		synced, behind := w.writeGroup(group, buf, refs, syncWanted || closing)
		w.setGather(len(group), behind, synced)

		clear(group) // drop the callbacks
		clear(refs)  // and the kept pieces
		w.groupRefs = refs[:0]
		if cap(buf) > groupBufKeepBytes && len(buf) < cap(buf)/4 {
			buf = nil
		}
		w.group, w.groupBuf = group[:0], buf[:0]
		w.mu.Lock()
		w.synced.Broadcast()
		done := closing && len(w.queue) == 0
		w.mu.Unlock()
		if done {
			return
		}
	}
}

// gather waits, with mu held on entry and on return (released while waiting), until the
// queue holds gatherTarget records, or gatherWait has passed, or Sync or Close asks.
func (w *WAL) gather() {
	w.gatherAt = w.gatherTarget
	w.mu.Unlock()
	w.gatherTimer.Reset(w.gatherWait)
	for {
		timedOut := false
		select {
		case <-w.wake:
		case <-w.gatherTimer.C:
			timedOut = true
		}
		w.mu.Lock()
		if timedOut || len(w.queue) >= w.gatherTarget || w.closing || w.syncWanted {
			break
		}
		w.mu.Unlock()
	}
	w.gatherTimer.Stop()
	w.gatherAt = 0
}

// setGather sets what the next group gathers, after a group of n records that synced in
// syncTime (0: it did not sync), with queued records waiting behind it when its sync ended
// (counted before its callbacks, so an appender that is back already is not counted twice).
// The appenders of a synced group are expected back (they wait for their records one at a
// time), so the next group waits for them and those queued meanwhile; a group that did not
// sync gathers nothing.
func (w *WAL) setGather(n, queued int, syncTime time.Duration) {
	w.gatherTarget, w.gatherWait = 0, 0
	if syncTime == 0 || n == 0 || !w.opts.Gather {
		return
	}
	w.gatherTarget = n + queued
	w.gatherWait = w.opts.GatherWait
	if w.gatherWait == 0 {
		w.gatherWait = min(syncTime/2, DefaultGatherWaitMax)
	}
}

// writeGroup writes the encoded records buf of group (possibly none), with their kept pieces
// refs gathered in (one pwritev; one write when there are none), syncs if wantSync or
// the sync mode or a forced record asks, and calls the callbacks. It returns how long the
// group's fdatasync took, 0 if it did not sync (or failed), and how many records were
// queued behind the group when the sync ended.
func (w *WAL) writeGroup(group []queued, buf []byte, refs []ref, wantSync bool) (syncTime time.Duration, behind int) {
	if w.failed {
		assert.That(len(group) == 0, "wal: records queued after fail-stop")
		return 0, 0
	}
	needSync := wantSync || (len(group) > 0 && w.opts.Sync == SyncAlways)
	if len(group) > 0 {
		if group[0].lsn != w.writtenLSN+1 { // checked before Failf boxes its arguments
			assert.Failf("wal: group starts at LSN %d after %d", group[0].lsn, w.writtenLSN)
		}
		if w.fileOff >= w.opts.SegmentBytes && w.fileOff > segmentHeaderSize {
			if err := w.roll(group[0].lsn); err != nil {
				w.fail(err, group, false)
				return 0, 0
			}
		}
		st := w.syncedThrough.Load()
		// - Every record says what was synced before it, never itself or later: recovery
		//   takes a valid record's synced LSN as proof that the records up to it were
		//   durable (torn tail or corruption, recover.go).
		assert.That(st <= w.writtenLSN, "wal: synced LSN past the written one")
		total := len(buf)
		r := 0 // refs[r:] belong to this record and the later ones
		for i, q := range group {
			end := len(buf)
			if i+1 < len(group) {
				end = group[i+1].off
			}
			// A record's kept pieces sit in (q.off, end]: every record starts with its
			// header, which is never kept.
			first := r
			for r < len(refs) && refs[r].at <= end {
				total += len(refs[r].b)
				r++
			}
			finishRecordPieces(buf[q.off:end], q.off, refs[first:r], st)
			needSync = needSync || q.force
			if invariants {
				rec := assembleRecord(buf[q.off:end], q.off, refs[first:r])
				h, _, size, err := decodeRecord(rec, w.opts.MaxRecordBytes)
				if !(err == nil && h.lsn == q.lsn && size == len(rec)) {
					assert.Failf("wal: record LSN %d encodes badly: %v", q.lsn, err)
				}
			}
		}
		assert.That(r == len(refs), "wal: kept pieces beyond the group's records")
		if end := w.fileOff + int64(total); end > w.allocEnd {
			w.preallocate(end) // a group larger than the reservation ahead
		}
		var n int
		var err error
		if len(refs) == 0 {
			n, err = w.file.WriteAt(buf, w.fileOff)
		} else {
			w.iov = gatherList(w.iov[:0], buf, refs)
			n, err = vfs.WriteVecAt(w.file, w.iov, w.fileOff)
			clear(w.iov)
		}
		if err == nil && n != total {
			err = io.ErrShortWrite
		}
		if err != nil {
			w.fail(fmt.Errorf("write %s at offset %d: %w", w.fileName(), w.fileOff, err), group, true)
			return 0, 0
		}
		w.fileOff += int64(total)
		// - A group is a run of consecutive LSNs, none past the last one queued
		//   (writtenLSN <= nextLSN-1).
		assert.That(group[len(group)-1].lsn == group[0].lsn+uint64(len(group))-1, "wal: group LSNs not consecutive")
		assert.That(group[len(group)-1].lsn <= w.lastLSN.Load(), "wal: group written past the last LSN queued")
		w.writtenLSN = group[len(group)-1].lsn
		w.records.Add(uint64(len(group)))
		w.bytes.Add(uint64(total))
		w.groups.Add(1)
	}
	if needSync && w.writtenLSN > w.syncedThrough.Load() {
		start := time.Now()
		if err := w.syncFile(); err != nil {
			w.fail(err, group, true)
			return 0, 0
		}
		syncTime = max(time.Since(start), time.Nanosecond)
		w.mu.Lock()
		behind = len(w.queue)
		w.mu.Unlock()
	}
	for _, q := range group {
		q.done(q.lsn, nil)
	}
	// Reserve ahead for the next groups after the acknowledgements, not before them.
	w.preallocate(w.fileOff)
	return syncTime, behind
}

// gatherList appends to iov the group's bytes in file order: buf's runs between the kept
// pieces refs, and the pieces.
func gatherList(iov [][]byte, buf []byte, refs []ref) [][]byte {
	pos := 0
	for _, r := range refs {
		if r.at > pos {
			iov = append(iov, buf[pos:r.at])
			pos = r.at
		}
		iov = append(iov, r.b)
	}
	if pos < len(buf) {
		iov = append(iov, buf[pos:])
	}
	return iov
}

// finishRecordPieces is finishRecord for a record whose inline bytes rec start at offset base
// of the group buffer, with the kept pieces refs gathered in.
func finishRecordPieces(rec []byte, base int, refs []ref, syncedThrough uint64) {
	if len(refs) == 0 {
		finishRecord(rec, syncedThrough)
		return
	}
	binary.LittleEndian.PutUint64(rec[recordSyncedOffset:], syncedThrough)
	crc := checksum.Of(rec[recordLengthOffset:recordCRCOffset])
	pos := recordLSNOffset
	for _, r := range refs {
		at := r.at - base
		crc = checksum.Update(crc, rec[pos:at])
		crc = checksum.Update(crc, r.b)
		pos = at
	}
	crc = checksum.Update(crc, rec[pos:])
	binary.LittleEndian.PutUint32(rec[recordCRCOffset:], crc)
}

// assembleRecord returns the record's bytes in one slice (the invariants check decodes it).
func assembleRecord(rec []byte, base int, refs []ref) []byte {
	if len(refs) == 0 {
		return rec
	}
	var out []byte
	pos := 0
	for _, r := range refs {
		out = append(append(out, rec[pos:r.at-base]...), r.b...)
		pos = r.at - base
	}
	return append(out, rec[pos:]...)
}

// syncFile fdatasyncs the active segment and advances syncedThrough.
func (w *WAL) syncFile() error {
	start := time.Now()
	if err := w.file.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", w.fileName(), err)
	}
	if w.opts.SyncLatency != nil {
		w.opts.SyncLatency.Since(start)
	}
	w.syncs.Add(1)
	// - syncedThrough <= writtenLSN, and it only grows.
	assert.That(w.writtenLSN >= w.syncedThrough.Load(), "wal: synced LSN goes back")
	w.syncedThrough.Store(w.writtenLSN)
	return nil
}

// roll syncs the active segment (so only the newest segment can have a torn tail), closes it
// and starts the segment whose first record has LSN first.
func (w *WAL) roll(first uint64) error {
	if w.writtenLSN > w.syncedThrough.Load() {
		if err := w.syncFile(); err != nil {
			return err
		}
	}
	if err := w.file.Close(); err != nil {
		return fmt.Errorf("close %s: %w", w.fileName(), err)
	}
	w.file = nil
	return w.createSegment(first)
}

// createSegment creates the segment file whose first record has LSN first, writes its
// header and makes its directory entry durable before any record in it can be acknowledged
// (fdatasync of the file does not persist the entry). Also called by Open, before the writer
// starts.
func (w *WAL) createSegment(first uint64) error {
	name := segmentName(first)
	f, err := w.fs.Create(path.Join(w.dir, name))
	if err != nil {
		return fmt.Errorf("create %s: %w", name, err)
	}
	var hdr [segmentHeaderSize]byte
	encodeSegmentHeader(hdr[:], first)
	if _, err := f.WriteAt(hdr[:], 0); err != nil {
		_ = f.Close()
		return fmt.Errorf("write %s header: %w", name, err)
	}
	if err := w.fs.SyncDir(w.dir); err != nil {
		_ = f.Close()
		return fmt.Errorf("create %s: sync dir: %w", name, err)
	}
	w.file, w.fileFirst, w.fileOff, w.allocEnd = f, first, segmentHeaderSize, segmentHeaderSize
	w.preallocate(segmentHeaderSize)
	w.bytes.Add(segmentHeaderSize)
	w.mu.Lock()
	w.segs = append(w.segs, first)
	w.mu.Unlock()
	return nil
}

// preallocate reserves the active segment's blocks ahead of end (where the writes reached,
// or where a group about to be written ends), in steps: when end comes within half a step of
// what is reserved, the reservation is extended to end plus preallocStep, capped at
// SegmentBytes (the group that crosses it is written without reservation; the next one
// rolls). So a new or idle log holds one step of blocks, not a whole segment, and a filling
// segment calls fallocate once per half step of records, after a group's acknowledgements.
// The reservation is advisory: a failure (a full disk, a file system without fallocate)
// shows up again on the write that needs the space, so it is ignored.
func (w *WAL) preallocate(end int64) {
	if w.opts.noPreallocate || end+preallocStep/2 <= w.allocEnd || w.allocEnd >= w.opts.SegmentBytes {
		return
	}
	target := min(end+preallocStep, w.opts.SegmentBytes)
	if target <= w.allocEnd {
		return
	}
	_ = w.file.Allocate(w.allocEnd, target-w.allocEnd)
	w.allocEnd = target
}

func (w *WAL) fileName() string { return segmentName(w.fileFirst) }

// fail makes the WAL fail-stop with cause: the records of group and every queued record get
// the sticky error, in LSN order, and no record is written or synced again. written says the
// group's bytes went to the file (all or some: a write or its fsync failed): its records then
// get an error that also wraps ErrUnknownOutcome, since a restart may find them; queued
// records were never written and get the sticky error alone.
func (w *WAL) fail(cause error, group []queued, written bool) {
	w.failed = true
	err := fmt.Errorf("%w: %w", ErrFailStop, cause)
	w.mu.Lock()
	w.err = err
	rest := w.queue
	w.queue = nil
	w.queueBuf = nil
	w.queueRefs, w.queueRefBytes = nil, 0
	close(w.spaceFreed)
	w.spaceFreed = make(chan struct{})
	w.spaceWatched = false
	w.synced.Broadcast()
	w.mu.Unlock()
	groupErr := err
	if written {
		groupErr = fmt.Errorf("%w: %w", ErrUnknownOutcome, err)
	}
	for _, q := range group {
		q.done(q.lsn, groupErr)
	}
	for _, q := range rest {
		q.done(q.lsn, err)
	}
}
