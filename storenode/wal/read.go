package wal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"

	"github.com/weftdb/weft/internal/corrupt"
	"github.com/weftdb/weft/internal/vfs"
)

// ReadFrom is where ReadRecords starts: the record of LSN LSN, and, when Segment is not zero,
// the segment and offset it is at (a Record's Segment and Offset), so that the records before
// it in its segment are not read again.
type ReadFrom struct {
	LSN     uint64
	Segment uint64
	Offset  int64
}

// ReadRecords hands fn the records from LSN from.LSN through LSN through, in LSN order, read
// back from the segment files, until fn returns more=false or an error (returned as is).
// Without a position in from, it reads from the start of the segment holding from.LSN (the
// records before it are read and checked, not handed on); with one, from there (a record of
// another LSN there is corruption). Every record is checked (CRC, lengths, consecutive LSNs);
// a bad one fails the read with corrupt.ErrCorruption. through must have been written (an
// acknowledged record's LSN is): later records, which the writer may be writing meanwhile,
// are never decoded. A segment dropped before or during the read fails it with an error
// wrapping ErrDropped. The Record's payload is valid during the call only. Any goroutine may
// call it; it reads through its own file handles and holds no lock of the WAL while it reads.
func (w *WAL) ReadRecords(from ReadFrom, through uint64, fn func(Record) (more bool, err error)) error {
	if from.LSN == 0 || from.LSN > through {
		return nil
	}
	w.mu.Lock()
	segs := slices.Clone(w.segs)
	w.mu.Unlock()
	if len(segs) == 0 || segs[0] > from.LSN {
		return fmt.Errorf("%w: read from LSN %d", ErrDropped, from.LSN)
	}
	i, _ := slices.BinarySearch(segs, from.LSN+1)
	i-- // segs[i] <= from.LSN < segs[i+1]
	start := readStart{lsn: segs[i], off: segmentHeaderSize}
	if from.Segment != 0 {
		if from.Segment != segs[i] || from.Offset < segmentHeaderSize {
			return fmt.Errorf("wal: read from LSN %d: position (segment %s, offset %d) not in its segment %s",
				from.LSN, segmentName(from.Segment), from.Offset, segmentName(segs[i]))
		}
		start = readStart{lsn: from.LSN, off: from.Offset}
	}
	var r segmentReader
	lsn := segs[i]
	for ; i < len(segs) && lsn <= through; i++ {
		if segs[i] != lsn {
			return corrupt.Errorf("wal: read: segment %s starts at LSN %d, want %d", segmentName(segs[i]), segs[i], lsn)
		}
		var more bool
		var err error
		if lsn, more, err = w.readSegmentRecords(&r, segs[i], start, from.LSN, through, fn); err != nil || !more {
			return err
		}
		start = readStart{}
	}
	if lsn <= through {
		return fmt.Errorf("wal: read through LSN %d: the log ends at LSN %d", through, lsn-1)
	}
	return nil
}

// readStart is where readSegmentRecords starts in its segment: the LSN at offset off (zero:
// the segment's first record, after its header).
type readStart struct {
	lsn uint64
	off int64
}

// readSegmentRecords reads the segment whose first LSN is first for ReadRecords, and returns
// the LSN after the last record it read, and more=false when fn asked to stop.
func (w *WAL) readSegmentRecords(r *segmentReader, first uint64, start readStart, from, through uint64, fn func(Record) (bool, error)) (uint64, bool, error) {
	name := path.Join(w.dir, segmentName(first))
	f, err := w.fs.Open(name)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return 0, false, fmt.Errorf("%w: read %s: %w", ErrDropped, name, err)
		}
		return 0, false, fmt.Errorf("wal: read: open %s: %w", name, err)
	}
	defer f.Close()
	size, err := f.Size()
	if err != nil {
		return 0, false, fmt.Errorf("wal: read: size of %s: %w", name, err)
	}
	r.reset(f, size)
	hdr, err := r.window(0, segmentHeaderSize)
	if err != nil {
		return 0, false, fmt.Errorf("wal: read %s: %w", name, err)
	}
	if got, err := decodeSegmentHeader(hdr); err != nil || got != first {
		return 0, false, corrupt.Errorf("wal: read %s: bad segment header (first LSN %d): %v", name, got, err)
	}
	off, lsn := int64(segmentHeaderSize), first
	if start.lsn != 0 {
		off, lsn = start.off, start.lsn
	}
	for lsn <= through {
		b, err := r.window(off, recordHeaderSize)
		if err != nil {
			return 0, false, fmt.Errorf("wal: read %s: %w", name, err)
		}
		if len(b) < recordHeaderSize || isZero(b) {
			break // the end of this segment's records
		}
		plen := int64(binary.LittleEndian.Uint32(b[recordLengthOffset:]))
		if plen > int64(w.opts.MaxRecordBytes) {
			return 0, false, corrupt.Errorf("wal: read %s at offset %d: record payload length %d exceeds %d", name, off, plen, w.opts.MaxRecordBytes)
		}
		rec, err := r.window(off, recordSize(int(plen)))
		if err != nil {
			return 0, false, fmt.Errorf("wal: read %s: %w", name, err)
		}
		h, payload, n, err := decodeRecord(rec, w.opts.MaxRecordBytes)
		if err != nil {
			return 0, false, fmt.Errorf("wal: read %s at offset %d: %w", name, off, err)
		}
		if h.lsn != lsn {
			return 0, false, corrupt.Errorf("wal: read %s at offset %d: record LSN %d, want %d", name, off, h.lsn, lsn)
		}
		if lsn >= from {
			more, err := fn(Record{LSN: lsn, Kind: h.kind, Payload: payload, Segment: first, Offset: off})
			if err != nil || !more {
				return lsn + 1, false, err
			}
		}
		off += int64(n)
		lsn++
	}
	return lsn, true, nil
}

// SegmentFirsts returns the first LSNs of the segment files in dir, ascending, without
// opening the log (nil for a directory without segments or one that does not exist). A log
// whose oldest segments were dropped is opened with Options.After = SegmentFirsts(...)[0]-1.
func SegmentFirsts(fsys vfs.FS, dir string) ([]uint64, error) {
	names, err := fsys.List(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("wal: list %s: %w", dir, err)
	}
	var firsts []uint64
	for _, name := range names {
		if first, ok := parseSegmentName(name); ok {
			firsts = append(firsts, first) // List sorts, and the names are fixed-width hex
		}
	}
	return firsts, nil
}
