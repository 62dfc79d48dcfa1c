package wal

import (
	"context"
	"encoding/binary"
	"fmt"
	"path"
	"slices"

	"github.com/weftdb/weft/internal/corrupt"
)

// Copy streams the bytes of the segment files that hold every record from LSN after+1 through
// LSN through, for an online backup: from the segment holding after+1 (from its header on, so
// its earlier records come too), whole segments, and the segment holding through cut right
// after that record. fn receives each piece as (the segment's first LSN, the offset in the
// segment file, the bytes); pieces of one segment come in offset order, segments in LSN order,
// and a segment's first piece starts at offset 0. b is valid during the call only; a piece
// holds whole records, at most copyChunkBytes of them, or one larger record.
//
// Every header and record copied is checked (CRC, consecutive LSNs) before fn sees it, so a
// damaged log fails the copy (corrupt.ErrCorruption, naming the file and offset) instead of
// producing a damaged backup. through must have been written (every LSN up to a durable one
// has): records after it, which the writer may be writing meanwhile, are never read. The
// caller keeps the segments from after+1 on from being dropped (DropBefore) until Copy
// returns. With through <= after the segment holding after+1 is copied through LSN after
// (maybe its header alone): a log that continues after LSN after needs one segment file. Any
// goroutine may call Copy; it reads through its own file handles and holds no lock of the WAL
// while it reads.
func (w *WAL) Copy(ctx context.Context, after, through uint64, fn func(first uint64, off int64, b []byte) error) error {
	through = max(through, after)
	w.mu.Lock()
	segs := slices.Clone(w.segs)
	w.mu.Unlock()
	i := 0
	for i+1 < len(segs) && segs[i+1] <= after+1 {
		i++
	}
	if len(segs) == 0 || segs[i] > after+1 {
		return fmt.Errorf("wal: copy from LSN %d: the segment holding it was dropped", after+1)
	}
	next := segs[i]
	var out []byte
	for k := i; i < len(segs) && (next <= through || i == k); i++ {
		if segs[i] != next {
			return corrupt.Errorf("wal: copy: segment %s starts at LSN %d, want %d", segmentName(segs[i]), segs[i], next)
		}
		var err error
		if next, out, err = w.copySegment(ctx, segs[i], through, out, fn); err != nil {
			return err
		}
	}
	if next <= through {
		return fmt.Errorf("wal: copy through LSN %d: the log ends at LSN %d", through, next-1)
	}
	return nil
}

// copyChunkBytes is the most record bytes Copy gathers into one piece.
const copyChunkBytes = 256 << 10

// copySegment copies the segment whose first LSN is first, up to its end or the record
// through, and returns the LSN after the last record copied. out is the gathering buffer,
// returned for reuse.
func (w *WAL) copySegment(ctx context.Context, first, through uint64, out []byte,
	fn func(uint64, int64, []byte) error) (uint64, []byte, error) {
	name := path.Join(w.dir, segmentName(first))
	f, err := w.fs.Open(name)
	if err != nil {
		return 0, out, fmt.Errorf("wal: copy: open %s: %w", name, err)
	}
	defer f.Close()
	size, err := f.Size()
	if err != nil {
		return 0, out, fmt.Errorf("wal: copy: size of %s: %w", name, err)
	}
	var r segmentReader
	r.reset(f, size)
	hdr, err := r.window(0, segmentHeaderSize)
	if err != nil {
		return 0, out, fmt.Errorf("wal: copy %s: %w", name, err)
	}
	if len(hdr) < segmentHeaderSize {
		return 0, out, corrupt.Errorf("wal: copy %s: segment header cut short", name)
	}
	if got, err := decodeSegmentHeader(hdr); err != nil || got != first {
		return 0, out, corrupt.Errorf("wal: copy %s: bad segment header (first LSN %d): %v", name, got, err)
	}
	out = append(out[:0], hdr...)
	outOff := int64(0)
	flush := func() error {
		if len(out) == 0 {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		err := fn(first, outOff, out)
		outOff += int64(len(out))
		out = out[:0]
		return err
	}
	off := int64(segmentHeaderSize)
	lsn := first
	for lsn <= through {
		b, err := r.window(off, recordHeaderSize)
		if err != nil {
			return 0, out, fmt.Errorf("wal: copy %s: %w", name, err)
		}
		if len(b) < recordHeaderSize || isZero(b) {
			break // the end of this segment's records
		}
		// The length first, checked against MaxRecordBytes before the record is read.
		plen := int64(binary.LittleEndian.Uint32(b[recordLengthOffset:]))
		if plen > int64(w.opts.MaxRecordBytes) {
			return 0, out, corrupt.Errorf("wal: copy %s at offset %d: record payload length %d exceeds %d", name, off, plen, w.opts.MaxRecordBytes)
		}
		size := int64(recordSize(int(plen)))
		rec, err := r.window(off, int(size))
		if err != nil {
			return 0, out, fmt.Errorf("wal: copy %s: %w", name, err)
		}
		h, _, _, err := decodeRecord(rec, w.opts.MaxRecordBytes)
		if err != nil {
			return 0, out, fmt.Errorf("wal: copy %s at offset %d: %w", name, off, err)
		}
		if h.lsn != lsn {
			return 0, out, corrupt.Errorf("wal: copy %s at offset %d: record LSN %d, want %d", name, off, h.lsn, lsn)
		}
		if len(out)+len(rec) > copyChunkBytes {
			if err := flush(); err != nil {
				return 0, out, err
			}
		}
		if len(rec) > copyChunkBytes {
			if err := ctx.Err(); err != nil {
				return 0, out, err
			}
			if err := fn(first, off, rec); err != nil {
				return 0, out, err
			}
			outOff = off + size
		} else {
			out = append(out, rec...)
		}
		off += size
		lsn++
	}
	if err := flush(); err != nil {
		return 0, out, err
	}
	return lsn, out, nil
}
