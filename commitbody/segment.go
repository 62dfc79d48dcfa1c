package commitbody

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"

	"github.com/weftdb/weft/base"
)

// CheckRowBytes reports whether n is a valid row size: RowBytesMin..RowBytesMax, a multiple of
// 8. The error wraps base.ErrBadRowSize.
func CheckRowBytes(n int) error {
	if n < RowBytesMin || n > RowBytesMax || n%8 != 0 {
		return fmt.Errorf("commitbody: row size %d, want %d..%d and a multiple of 8: %w", n, RowBytesMin, RowBytesMax, base.ErrBadRowSize)
	}
	return nil
}

// ValidateSegment reports whether s may be encoded: its header rules, and Rows of RowsSize
// bytes. Its errors wrap base.ErrBadRowSize or base.ErrMalformed.
func ValidateSegment(s *base.Segment) error { return ValidateSegmentRows(s, len(s.Rows)) }

// ValidateSegmentRows is ValidateSegment for a segment whose rows are rowsLen bytes held
// elsewhere (a gather list of runs) rather than in s.Rows.
func ValidateSegmentRows(s *base.Segment, rowsLen int) error {
	if !segmentHeaderOK(s) {
		return segmentHeaderError(s)
	}
	if want := s.RowsSize(); rowsLen != want {
		return fmt.Errorf("commitbody: segment of table %d page %d: %d row bytes for %d rows of %d bytes, want %d: %w",
			s.Table, s.Page, rowsLen, bits.OnesCount64(s.Data), s.RowBytes, want, base.ErrBadRowSize)
	}
	return nil
}

// segmentHeaderOK is the test of the header rules, small enough to inline into the decoder's
// loop.
func segmentHeaderOK(s *base.Segment) bool {
	return s.RowBytes-RowBytesMin <= RowBytesMax-RowBytesMin && s.RowBytes&7 == 0 && s.Page <= PageMax && s.Data&s.Clear == 0
}

// segmentHeaderError is the error of a header that fails segmentHeaderOK.
func segmentHeaderError(s *base.Segment) error {
	if err := CheckRowBytes(int(s.RowBytes)); err != nil {
		return err
	}
	if s.Page > PageMax {
		return fmt.Errorf("commitbody: segment of table %d: page %d beyond the last page %d: %w", s.Table, s.Page, uint64(PageMax), base.ErrMalformed)
	}
	both := s.Data & s.Clear
	return fmt.Errorf("commitbody: segment of table %d page %d: data mask %#016x and clear mask %#016x share slots %#016x: %w",
		s.Table, s.Page, s.Data, s.Clear, both, base.ErrMalformed)
}

// getSegmentHeader decodes the header h[:SegmentHeaderBytes] into s, all but Rows.
func getSegmentHeader(h []byte, s *base.Segment) {
	_ = h[SegmentHeaderBytes-1]
	s.Table = binary.LittleEndian.Uint32(h[0:])
	s.RowBytes = binary.LittleEndian.Uint16(h[4:])
	s.Page = binary.LittleEndian.Uint64(h[8:])
	s.Data = binary.LittleEndian.Uint64(h[16:])
	s.Clear = binary.LittleEndian.Uint64(h[24:])
}

// parseSegment decodes and checks the segment at b[off:] into s (Rows aliasing b) and returns
// the offset after it.
func parseSegment(b []byte, off int, s *base.Segment) (int, error) {
	if len(b)-off < SegmentHeaderBytes {
		return 0, truncatedError(b, off, SegmentHeaderBytes)
	}
	h := b[off : off+SegmentHeaderBytes : off+SegmentHeaderBytes]
	getSegmentHeader(h, s)
	if binary.LittleEndian.Uint16(h[6:]) != 0 {
		return 0, fmt.Errorf("commitbody: segment at offset %d: reserved field not zero: %w", off, base.ErrMalformed)
	}
	if !segmentHeaderOK(s) {
		// A rule broken in a decoded header makes the body malformed, whatever else it is.
		err := segmentHeaderError(s)
		if errors.Is(err, base.ErrMalformed) {
			return 0, fmt.Errorf("commitbody: segment at offset %d: %w", off, err)
		}
		return 0, fmt.Errorf("commitbody: segment at offset %d: %w: %w", off, err, base.ErrMalformed)
	}
	off += SegmentHeaderBytes
	n := s.RowsSize()
	if n > len(b)-off {
		return 0, truncatedError(b, off, n)
	}
	s.Rows = b[off : off+n : off+n]
	return off + n, nil
}

// truncatedError is the error of n bytes wanted at off, beyond b's end.
func truncatedError(b []byte, off, n int) error {
	return fmt.Errorf("commitbody: %d bytes wanted at offset %d of %d: %w", n, off, len(b), base.ErrTruncated)
}

// WalkSegments checks the n segments that start at b[off:], back to back, and returns an
// iterator over them and the offset after the last. It allocates nothing (except on failure).
// It is the segment decoder of Decode and of sgio's Segments replies.
func WalkSegments(b []byte, off, n int) (SegmentIter, int, error) {
	start := off
	var s base.Segment
	for range n {
		var err error
		if off, err = parseSegment(b, off, &s); err != nil {
			return SegmentIter{}, 0, err
		}
	}
	return SegmentIter{b: b[start:off:off], left: n}, off, nil
}

// SegmentIter walks segments that WalkSegments or Decode checked, without allocating. The
// segments' Rows alias the body they came from. The zero SegmentIter is empty. An iterator may
// be used by one goroutine at a time; copies iterate independently.
type SegmentIter struct {
	b    []byte // the segments, back to back
	off  int    // of the next segment in b
	left int
}

// Len reports the number of segments not yet returned by Next.
func (it *SegmentIter) Len() int { return it.left }

// Next fills s with the next segment and reports true, or reports false when none is left.
// Filling the caller's Segment, rather than returning one, keeps the loop free of large
// struct copies. Declare the iterator before the loop (it := v.Segments(); for it.Next(&s)
// {...}): as a for-clause variable it would be copied every iteration.
func (it *SegmentIter) Next(s *base.Segment) bool {
	if it.left == 0 {
		return false
	}
	getSegmentHeader(it.b[it.off:it.off+SegmentHeaderBytes:it.off+SegmentHeaderBytes], s)
	start := it.off + SegmentHeaderBytes
	end := start + bits.OnesCount64(s.Data)*int(s.RowBytes)
	s.Rows = it.b[start:end:end]
	it.off = end
	it.left--
	return true
}
