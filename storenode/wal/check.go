package wal

import (
	"errors"
	"fmt"

	"github.com/weftdb/weft/internal/corrupt"
	"github.com/weftdb/weft/internal/vfs"
)

// CheckResult is what Check found in a log.
type CheckResult struct {
	// Segments is the number of segment files read (those wholly at or below After are not).
	Segments int
	// Records is the number of good records read (checksum, lengths, reserved bytes and LSN
	// order checked), those at or below After included.
	Records uint64
	// Bytes is the number of bytes of segment files read up to the end of the good records.
	Bytes int64
	// FirstLSN is the first LSN of the first segment read (0: no segment).
	FirstLSN uint64
	// LastLSN is the LSN of the last good record: where recovery's replay would end.
	LastLSN uint64
	// Tail is the torn tail recovery would drop, nil when the log ends cleanly.
	Tail *TornTail
	// Bad is where the damage was found when Check returned a corruption error: File is
	// empty when the error is about the directory (no segment at all).
	Bad Position
	// OldSegments and OldRecords count the segments wholly at or below After, which recovery
	// does not read (the next checkpoint deletes them), and their good records; OldBad lists
	// what is wrong in them. Damage there loses nothing.
	OldSegments int
	OldRecords  uint64
	OldBad      []OldDamage
}

// OldDamage is a bad record (or a segment ending early) in a segment recovery does not read.
type OldDamage struct {
	Position
	Cause error
}

// TornTail is the end of a log that a crash cut: the record at File, Offset (where LSN was
// due) is bad and no later record proves it had been durable. Recovery truncates File at
// Offset and removes the later segment files (Removed).
type TornTail struct {
	File    string // segment file name
	Offset  int64
	LSN     uint64
	Bytes   int64 // bytes of File from Offset to its end
	Cause   error // why the record at Offset is bad
	Removed []string
}

// Position is a place in a log: a segment file name, a byte offset, the LSN due there.
type Position struct {
	File   string
	Offset int64
	LSN    uint64
}

// Check reads the log in dir as recovery's first pass would (Open with opts, recovery in
// docs/wal.md), and the segments recovery skips (OldBad), and changes nothing: it opens no file for writing, takes no lock (the caller
// keeps writers out, as storenode.Check does with the store's lock) and never truncates or
// rewrites. visit (nil: none) receives every good record with LSN > opts.After and where it
// lies, in LSN order, on the calling goroutine, before the end of the log is settled; its
// payload is valid only during the call, and an error from visit stops Check and is returned
// wrapped.
//
// The error wraps corrupt.ErrCorruption when recovery would fail (res.Bad says where): a bad
// record at or below After or DurableThrough, or proved durable by a later record or a later
// segment, a valid record out of LSN order, a missing segment, a log that ends before After or
// DurableThrough. A torn tail is not an error: res.Tail describes it. Other errors are IO
// errors. res counts what was read up to where Check stopped.
func Check(fsys vfs.FS, dir string, opts Options, visit func(Record, Position) error) (res CheckResult, err error) {
	opts, err = opts.withDefaults()
	if err != nil {
		return res, err
	}
	w := &WAL{fs: fsys, dir: dir, opts: opts}
	firsts, s, err := w.listSegments()
	if err != nil {
		if len(firsts) > 0 {
			res.Bad = Position{File: segmentName(firsts[s]), LSN: opts.After + 1}
		}
		return res, err
	}
	if len(firsts) == 0 {
		return res, nil
	}
	res.FirstLSN = firsts[s]
	if err := checkOld(w, firsts[:s+1], &res); err != nil {
		return res, err
	}
	r := &recovery{w: w, firsts: firsts}
	if visit != nil {
		r.replay = func(rec Record) error {
			return visit(rec, Position{File: segmentName(r.firsts[r.cur.seg]), Offset: r.cur.off, LSN: rec.LSN})
		}
	}
	defer r.closeFile()
	end, err := r.scan(s)
	res.Segments = r.bad.seg - s + 1
	if err != nil {
		res.Bad = Position{File: segmentName(firsts[r.bad.seg]), Offset: r.bad.off, LSN: r.bad.lsn}
		res.LastLSN = r.bad.lsn - 1
		res.Records = r.bad.lsn - firsts[s]
		return res, err
	}
	res.LastLSN = end.next - 1
	res.Records = end.next - firsts[s]
	res.Segments = end.seg - s + 1
	for i := s; i < end.seg; i++ {
		size, err := fileSize(fsys, r.path(i))
		if err != nil {
			return res, err
		}
		res.Bytes += size
	}
	res.Bytes += end.off
	if end.torn {
		size, err := fileSize(fsys, r.path(end.seg))
		if err != nil {
			return res, err
		}
		t := &TornTail{File: segmentName(firsts[end.seg]), Offset: end.off, LSN: end.next,
			Bytes: max(size-end.off, 0), Cause: end.cause}
		for j := end.seg + 1; j < len(firsts); j++ {
			t.Removed = append(t.Removed, segmentName(firsts[j]))
		}
		res.Tail = t
	}
	return res, nil
}

func fileSize(fsys vfs.FS, name string) (int64, error) {
	f, err := fsys.Open(name)
	if err != nil {
		return 0, fmt.Errorf("wal: open %s: %w", name, err)
	}
	defer f.Close()
	size, err := f.Size()
	if err != nil {
		return 0, fmt.Errorf("wal: size of %s: %w", name, err)
	}
	return size, nil
}

// checkOld reads the segments of firsts but the last (each ends where the next begins), which
// recovery skips, and records their damage in res.
func checkOld(w *WAL, firsts []uint64, res *CheckResult) error {
	for i := 0; i+1 < len(firsts); i++ {
		r := &recovery{w: w, firsts: firsts}
		if err := r.openSegment(i); err != nil {
			return err
		}
		expected := firsts[i]
		off, badCause, err := r.readSegmentUntil(i, &expected, firsts[i+1])
		r.closeFile()
		res.OldSegments++
		res.OldRecords += expected - firsts[i]
		at := Position{File: segmentName(firsts[i]), Offset: off, LSN: expected}
		switch {
		case err != nil && !errors.Is(err, corrupt.ErrCorruption):
			return err
		case err != nil:
			res.OldBad = append(res.OldBad, OldDamage{Position: at, Cause: err})
		case badCause != nil:
			res.OldBad = append(res.OldBad, OldDamage{Position: at, Cause: badCause})
		case expected != firsts[i+1]:
			res.OldBad = append(res.OldBad, OldDamage{Position: at,
				Cause: corrupt.Errorf("wal: %s ends at LSN %d, the next segment starts at %d", at.File, expected-1, firsts[i+1])})
		}
	}
	return nil
}
