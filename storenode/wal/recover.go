package wal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"

	"github.com/weftdb/weft/internal/assert"
	"github.com/weftdb/weft/internal/corrupt"
	"github.com/weftdb/weft/internal/vfs"
)

// Recovery, run by Open before the writer starts. It reads the segments in LSN order and
// checks every record (CRC, lengths, LSN continuity, the first LSN of each segment against
// its name). At the first bad record, at (file, offset) where LSN L was expected, it scans
// forward in recordAlign steps through the rest of the log for a valid record whose
// synced-through LSN is >= L: such a record proves L had been durable, so the log is corrupt
// and Open fails, changing nothing. So does a later segment file: a segment is created only
// after the one before it was synced. Otherwise the bad record, in the newest segment, is a
// torn tail: the segment is truncated at the bad record.

// readChunkBytes is how much recovery reads from a segment at a time.
const readChunkBytes = 256 << 10

// recover rebuilds the WAL's state from dir and leaves the active segment open for appends.
func (w *WAL) recover(replay func(Record) error) error {
	firsts, s, err := w.listSegments()
	if err != nil {
		return err
	}
	if len(firsts) == 0 {
		return w.openFresh(1, nil)
	}
	// Pass 1 checks every record and settles the tail (torn or corrupt) without replaying:
	// keepTail then rewrites and syncs the records that may live in the page cache only, so
	// pass 2 replays from a log that is durable as read. Replaying first would let the
	// caller act (checkpoint) on records that a power loss can still take away: after a
	// failed fsync, Linux keeps the dropped pages readable but never writes them (fsyncgate).
	r := &recovery{w: w, firsts: firsts}
	defer r.closeFile()
	if err := r.check(s); err != nil {
		return err
	}
	if replay == nil {
		return nil
	}
	return r.replayAll(s, w.nextLSN, replay)
}

// listSegments returns the first LSNs of the segment files, ascending, and the index of the
// first one recovery reads (those wholly at or below After are not read). No segment at all is
// fine only for a new log (After 0). When the first segment to read starts too late, the
// error comes with firsts and s, so Check can name it.
func (w *WAL) listSegments() (firsts []uint64, s int, err error) {
	after := w.opts.After
	names, err := w.fs.List(w.dir)
	if err != nil {
		return nil, 0, fmt.Errorf("wal: open %s: %w", w.dir, err)
	}
	for _, name := range names {
		if first, ok := parseSegmentName(name); ok {
			if first == 0 {
				return nil, 0, corrupt.Errorf("wal: %s: segment %s: LSN 0", w.dir, name)
			}
			firsts = append(firsts, first) // List sorts, and the names are fixed-width hex
		}
	}
	if len(firsts) == 0 {
		if after > 0 {
			return nil, 0, corrupt.Errorf("wal: %s: no segment files, but records after LSN %d must exist", w.dir, after)
		}
		return nil, 0, nil
	}
	// Segments wholly at or below After are not read.
	for s+1 < len(firsts) && firsts[s+1]-1 <= after {
		s++
	}
	if firsts[s] > after+1 {
		return firsts, s, corrupt.Errorf("wal: %s: first segment %s starts after LSN %d: records %d..%d missing",
			w.dir, segmentName(firsts[s]), after+1, after+1, firsts[s]-1)
	}
	return firsts, s, nil
}

// check is recovery's first pass, from segment s on: it checks the records and keeps the
// tail (keepTail), or fails.
func (r *recovery) check(s int) error {
	end, err := r.scan(s)
	if err != nil {
		return err
	}
	return r.keepTail(end.seg, end.off, end.next, end.torn)
}

// logEnd is where the good records of a log end.
type logEnd struct {
	seg   int    // index in firsts of the segment they end in
	off   int64  // offset after the last good record there
	next  uint64 // the LSN after the last good record
	torn  bool   // a torn tail follows (from off, and every later segment): keepTail drops it
	cause error  // why the record at off is bad, when torn
}

// scan is the checking half of pass 1, from segment s on, and changes nothing: it reads every
// record and returns where the good ones end, or the corruption (or IO) error that fails
// recovery. On an error, r.bad says where it was found. It leaves the segment it ended in open.
func (r *recovery) scan(s int) (logEnd, error) {
	w, firsts, after := r.w, r.firsts, r.w.opts.After
	expected := firsts[s]
	for i := s; i < len(firsts); i++ {
		r.bad = badAt{seg: i, lsn: expected}
		if firsts[i] != expected {
			return logEnd{}, corrupt.Errorf("wal: %s: segment %s starts at LSN %d, but the previous segment ends at LSN %d",
				w.dir, segmentName(firsts[i]), firsts[i], expected-1)
		}
		if err := r.openSegment(i); err != nil {
			return logEnd{}, err
		}
		off, badCause, err := r.readSegment(i, &expected)
		r.bad = badAt{seg: i, off: off, lsn: expected}
		if err != nil {
			return logEnd{}, err
		}
		if badCause != nil {
			if err := r.badRecord(i, off, expected, badCause); err != nil {
				return logEnd{}, err
			}
			return logEnd{seg: i, off: off, next: expected, torn: true, cause: badCause}, nil
		}
		if i+1 < len(firsts) {
			r.closeFile()
			continue
		}
		// The last segment ended cleanly at off: append there.
		if expected-1 < after {
			return logEnd{}, corrupt.Errorf("wal: %s: log ends at LSN %d, before the checkpoint LSN %d", w.dir, expected-1, after)
		}
		if expected-1 < w.opts.DurableThrough {
			return logEnd{}, corrupt.Errorf("wal: %s: log ends at LSN %d, before LSN %d, which was durable when the last checkpoint was published",
				w.dir, expected-1, w.opts.DurableThrough)
		}
		return logEnd{seg: i, off: off, next: expected}, nil
	}
	panic("unreachable")
}

// replayAll is recovery's second pass: it hands every record after After and before next to
// replay, in LSN order, reading the segments from s on again (they are durable now). A record
// that pass 1 accepted and that does not read back the same is corruption.
func (r *recovery) replayAll(s int, next uint64, replay func(Record) error) error {
	w := r.w
	w.mu.Lock()
	segs := slices.Clone(w.segs)
	w.mu.Unlock()
	r.replay = replay
	expected := r.firsts[s]
	for i := s; i < len(segs) && expected < next; i++ {
		r.firsts = segs
		if err := r.openSegment(i); err != nil {
			return err
		}
		_, badCause, err := r.readSegmentUntil(i, &expected, next)
		r.closeFile()
		if err != nil {
			return err
		}
		if badCause != nil {
			return corrupt.Errorf("wal: %s: record LSN %d changed between the two passes of recovery: %w", r.path(i), expected, badCause)
		}
	}
	if expected != next {
		return corrupt.Errorf("wal: %s: replay reached LSN %d, the log ends at %d", w.dir, expected-1, next-1)
	}
	return nil
}

// openFresh starts a log with no surviving records from LSN next on: it creates the segment
// named next; segs are the surviving older segment files.
func (w *WAL) openFresh(next uint64, segs []uint64) error {
	w.segs = segs
	w.nextLSN = next
	w.lastLSN.Store(next - 1)
	w.writtenLSN = next - 1
	w.syncedThrough.Store(next - 1)
	if err := w.createSegment(next); err != nil {
		return fmt.Errorf("wal: open %s: %w", w.dir, err)
	}
	return nil
}

// recovery is the state of one recovery pass.
type recovery struct {
	w      *WAL
	firsts []uint64 // first LSNs of the segment files, ascending
	replay func(Record) error
	file   vfs.File // the segment being read
	reader segmentReader
	// lastSynced is the synced-through LSN of the last good record: records up to it had
	// been durable; later ones may live in the page cache only.
	lastSynced uint64
	// bad is where scan stopped when it failed; cur is the record being replayed.
	bad, cur badAt
}

// badAt is a place in the log: segment index, offset, the LSN due there.
type badAt struct {
	seg int
	off int64
	lsn uint64
}

func (r *recovery) path(i int) string { return path.Join(r.w.dir, segmentName(r.firsts[i])) }

func (r *recovery) openSegment(i int) error {
	f, err := r.w.fs.Open(r.path(i))
	if err != nil {
		return fmt.Errorf("wal: open %s: %w", r.path(i), err)
	}
	size, err := f.Size()
	if err != nil {
		_ = f.Close()
		return fmt.Errorf("wal: open %s: %w", r.path(i), err)
	}
	r.file = f
	r.reader.reset(f, size)
	return nil
}

func (r *recovery) closeFile() {
	if r.file != nil {
		_ = r.file.Close()
		r.file = nil
	}
}

// readSegment checks and replays the records of segment i from its start, expecting the
// LSN *expected next. It returns the end of the last good record, and the cause when it
// stopped at a bad record (then off is the bad record's offset); err is an IO, replay or
// corruption error that ends recovery.
func (r *recovery) readSegment(i int, expected *uint64) (off int64, badCause, err error) {
	return r.readSegmentUntil(i, expected, 0)
}

// readSegmentUntil is readSegment that stops before LSN until (0: at the end of the segment).
func (r *recovery) readSegmentUntil(i int, expected *uint64, until uint64) (off int64, badCause, err error) {
	hdr, err := r.reader.window(0, segmentHeaderSize)
	if err != nil {
		return 0, nil, err
	}
	first, err := decodeSegmentHeader(hdr)
	if err != nil {
		return 0, err, nil
	}
	if first != r.firsts[i] {
		return 0, corrupt.Errorf("wal: segment header says first LSN %d", first), nil
	}
	off = segmentHeaderSize
	for off < r.reader.size && (until == 0 || *expected < until) {
		h, payload, size, err := r.recordAt(off)
		if err != nil {
			if errors.Is(err, corrupt.ErrCorruption) {
				return off, err, nil
			}
			return off, nil, err
		}
		if h.lsn != *expected {
			// A valid record at the wrong place is never a torn write: a crash does not make
			// a checksum match.
			return off, nil, corrupt.Errorf("wal: %s offset %d: record has LSN %d, want %d", r.path(i), off, h.lsn, *expected)
		}
		if h.lsn > r.w.opts.After && r.replay != nil {
			r.cur = badAt{seg: i, off: off, lsn: h.lsn}
			if err := r.replay(Record{LSN: h.lsn, Kind: h.kind, Payload: payload, Segment: r.firsts[i], Offset: off}); err != nil {
				return off, nil, fmt.Errorf("wal: replay LSN %d: %w", h.lsn, err)
			}
		}
		r.lastSynced = h.syncedThrough
		*expected++
		off += int64(size)
	}
	return off, nil, nil
}

// recordAt decodes the record at off in the current segment. The length field is checked
// against MaxRecordBytes before the payload is read.
func (r *recovery) recordAt(off int64) (recordHeader, []byte, int, error) {
	hdr, err := r.reader.window(off, recordHeaderSize)
	if err != nil {
		return recordHeader{}, nil, 0, err
	}
	if len(hdr) < recordHeaderSize {
		return decodeRecord(hdr, r.w.opts.MaxRecordBytes) // cut short: a corruption error
	}
	n := int64(binary.LittleEndian.Uint32(hdr[recordLengthOffset:]))
	if n > int64(r.w.opts.MaxRecordBytes) {
		return decodeRecord(hdr, r.w.opts.MaxRecordBytes) // too long: a corruption error
	}
	b, err := r.reader.window(off, recordSize(int(n)))
	if err != nil {
		return recordHeader{}, nil, 0, err
	}
	return decodeRecord(b, r.w.opts.MaxRecordBytes)
}

// badRecord decides what the bad record at offset off of segment i, where LSN expected was
// due, is: corruption (the error, which fails Open) or a torn tail (nil: keepTail truncates
// it, and appends continue there). It changes nothing.
func (r *recovery) badRecord(i int, off int64, expected uint64, cause error) error {
	if expected <= r.w.opts.After {
		return corrupt.Errorf("wal: %s offset %d: bad record (LSN %d, at or below the checkpoint LSN %d): %w",
			r.path(i), off, expected, r.w.opts.After, cause)
	}
	if expected <= r.w.opts.DurableThrough {
		return corrupt.Errorf("wal: %s offset %d: bad record (LSN %d, at or below LSN %d, which was durable when the last checkpoint was published): %w",
			r.path(i), off, expected, r.w.opts.DurableThrough, cause)
	}
	if i+1 < len(r.firsts) {
		// A segment is created only after the one before it was synced through its end
		// (roll), in every sync mode: its mere name proves the bad record had been durable.
		return corrupt.Errorf("wal: %s offset %d: bad record (LSN %d expected): %w; "+
			"segment %s exists, and a segment is made only after the one before it was synced, so the bad one had been durable",
			r.path(i), off, expected, cause, segmentName(r.firsts[i+1]))
	}
	found, err := r.findCovering(i, off, expected)
	if err != nil {
		return err
	}
	if found != nil {
		return corrupt.Errorf("wal: %s offset %d: bad record (LSN %d expected): %w; "+
			"the valid record LSN %d at %s offset %d was written when LSN %d was synced, so the bad one had been durable",
			r.path(i), off, expected, cause, found.lsn, found.file, found.off, found.syncedThrough)
	}
	return nil
}

// covering is a valid record found after a bad one.
type covering struct {
	file          string
	off           int64
	lsn           uint64
	syncedThrough uint64
}

// findCovering scans the log after offset off of segment i, in recordAlign steps, for a
// valid record whose synced-through LSN is at least lsn. It leaves segment i open.
func (r *recovery) findCovering(i int, off int64, lsn uint64) (*covering, error) {
	for j := i; j < len(r.firsts); j++ {
		start := off + recordAlign
		if j > i {
			r.closeFile()
			if err := r.openSegment(j); err != nil {
				return nil, err
			}
			start = segmentHeaderSize
		}
		for o := start; o+recordHeaderSize <= r.reader.size; o += recordAlign {
			hdr, err := r.reader.window(o, recordHeaderSize)
			if err != nil {
				return nil, err
			}
			// Cheap filters first, so garbage costs no checksum.
			recLSN := binary.LittleEndian.Uint64(hdr[recordLSNOffset:])
			synced := binary.LittleEndian.Uint64(hdr[recordSyncedOffset:])
			if synced < lsn || recLSN <= synced {
				continue
			}
			h, _, _, err := r.recordAt(o)
			if err == nil && h.syncedThrough >= lsn {
				return &covering{file: segmentName(r.firsts[j]), off: o, lsn: h.lsn, syncedThrough: h.syncedThrough}, nil
			}
			if err != nil && !errors.Is(err, corrupt.ErrCorruption) {
				return nil, err
			}
		}
	}
	if len(r.firsts)-1 != i {
		r.closeFile()
		return nil, r.openSegment(i)
	}
	return nil, nil
}

// keepTail makes segment i, with its good records ending at off, the active segment and
// next the next LSN. With torn set it first truncates the segment at off and removes every
// later segment; a segment without a good header is removed and created anew.
func (r *recovery) keepTail(i int, off int64, next uint64, torn bool) error {
	w := r.w
	if torn {
		for j := len(r.firsts) - 1; j > i; j-- {
			if err := w.fs.Remove(r.path(j)); err != nil {
				return fmt.Errorf("wal: remove torn segment %s: %w", r.path(j), err)
			}
		}
		if off < segmentHeaderSize {
			r.closeFile()
			if err := w.fs.Remove(r.path(i)); err != nil {
				return fmt.Errorf("wal: remove torn segment %s: %w", r.path(i), err)
			}
			if err := w.fs.SyncDir(w.dir); err != nil {
				return fmt.Errorf("wal: open %s: sync dir: %w", w.dir, err)
			}
			return w.openFresh(next, r.firsts[:i])
		}
		if err := r.file.Truncate(off); err != nil {
			return fmt.Errorf("wal: truncate torn tail of %s at %d: %w", r.path(i), off, err)
		}
	}
	// The entries of the segments found may not be durable (a kill -9 of a process whose
	// directory sync had not run or failed), and later segments may have been removed.
	if err := w.fs.SyncDir(w.dir); err != nil {
		return fmt.Errorf("wal: open %s: sync dir: %w", w.dir, err)
	}
	// Recovered records count as synced from here on, so make them (and the truncation)
	// durable. The records after the last synced-through LSN may be in the page cache
	// only: after kill -9 with SyncNone, or after an fsync that failed, when Linux marks the
	// pages clean without having written them (fsyncgate), so a plain fsync would not write
	// them. Rewriting their bytes dirties the pages again.
	if err := r.rewriteUnsynced(i, off, next); err != nil {
		return err
	}
	if err := r.file.Sync(); err != nil {
		return fmt.Errorf("wal: open %s: sync %s: %w", w.dir, r.path(i), err)
	}
	w.file, w.fileFirst, w.fileOff, w.allocEnd = r.file, r.firsts[i], off, off
	w.preallocate(off)
	r.file = nil
	w.segs = r.firsts[:i+1]
	w.nextLSN = next
	w.lastLSN.Store(next - 1)
	w.writtenLSN = next - 1
	w.syncedThrough.Store(next - 1)
	return nil
}

// rewriteUnsynced writes again, in place, the bytes of segment i from the first record after
// lastSynced (or from the segment header, if that is the segment's first record) to end,
// where the good records end; next is the LSN after the last good record.
func (r *recovery) rewriteUnsynced(i int, end int64, next uint64) error {
	if r.lastSynced+1 >= next {
		return nil // every record had been synced
	}
	r.reader.reset(r.file, end)
	from := int64(0)
	if first := r.firsts[i]; r.lastSynced+1 > first {
		from = segmentHeaderSize
		for lsn := first; lsn <= r.lastSynced; lsn++ {
			hdr, err := r.reader.window(from, recordHeaderSize)
			if err != nil {
				return err
			}
			// Checked by readSegment already.
			if len(hdr) != recordHeaderSize {
				assert.Failf("wal: record LSN %d vanished at %d", lsn, from)
			}
			from += int64(recordSize(int(binary.LittleEndian.Uint32(hdr[recordLengthOffset:]))))
		}
	}
	for from < end {
		b, err := r.reader.window(from, readChunkBytes)
		if err != nil {
			return err
		}
		if len(b) == 0 {
			return fmt.Errorf("wal: rewrite %s at %d: file shrank", r.path(i), from)
		}
		if _, err := r.file.WriteAt(b, from); err != nil {
			return fmt.Errorf("wal: rewrite unsynced tail of %s at %d: %w", r.path(i), from, err)
		}
		from += int64(len(b))
	}
	return nil
}

// segmentReader reads a segment file through a window buffer, so records are checked in
// place without a read per record.
type segmentReader struct {
	f     vfs.File
	size  int64 // file size when opened, shrunk if reads end earlier
	buf   []byte
	start int64 // file offset of buf[0]
}

func (r *segmentReader) reset(f vfs.File, size int64) {
	r.f, r.size, r.buf, r.start = f, size, r.buf[:0], 0
}

// window returns n bytes of the file from off, fewer at the end of the file. The slice is
// valid until the next call. n is bounded by the caller (header size or a checked record
// size), so the buffer stays within MaxRecordBytes plus a header.
func (r *segmentReader) window(off int64, n int) ([]byte, error) {
	if off >= r.size {
		return nil, nil
	}
	n = int(min(int64(n), r.size-off))
	if off >= r.start && off+int64(n) <= r.start+int64(len(r.buf)) {
		return r.buf[off-r.start:][:n], nil
	}
	m := int(min(int64(max(n, readChunkBytes)), r.size-off))
	if cap(r.buf) < m {
		r.buf = make([]byte, m)
	}
	r.buf = r.buf[:m]
	k, err := r.f.ReadAt(r.buf, off)
	if k < m {
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("wal: read at %d: %w", off, err)
		}
		r.size = off + int64(k) // the file is shorter than Size said
	}
	r.buf, r.start = r.buf[:k], off
	return r.buf[:min(n, k)], nil
}
