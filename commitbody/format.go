package commitbody

import (
	"encoding/binary"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/logicpage"
)

// Sizes and bounds of a Commit body. Part of the format; do not change.
const (
	// HeaderBytes is the size of a Commit body before its fences: owner, seq, fence count,
	// segment count.
	HeaderBytes = 24
	// FenceBytes is the size of one fence: table u32, reserved u32, epoch u64.
	FenceBytes = 16
	// SegmentHeaderBytes is the size of a sparse segment's header; its rows follow it.
	SegmentHeaderBytes = 32
	// BodyBytesMax is the largest Commit body: the wire's hard maximum of any frame body
	// (sgio.MaxBodyLimit is this constant), and so, after its batch hash, the storage
	// engine's largest WAL commit record.
	BodyBytesMax = 64 << 20

	// PageMax is the largest page number a segment can carry, and RowBytesMin and RowBytesMax
	// bound its row size (also a multiple of 8): logicpage's, the page geometry's one
	// definition.
	PageMax     = logicpage.PageMax
	RowBytesMin = logicpage.RowBytesMin
	RowBytesMax = logicpage.RowBytesMax
)

// AppendHeader appends the fixed fields of a Commit body (owner, seq, the fence and segment
// counts) and returns the extended slice; the fences (AppendFence) and the segments
// (AppendSegmentHeader and the rows, or AppendSegment) follow. It checks nothing.
func AppendHeader(dst []byte, owner, seq uint64, fences, segments int) []byte {
	dst = binary.LittleEndian.AppendUint64(dst, owner)
	dst = binary.LittleEndian.AppendUint64(dst, seq)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(fences))
	return binary.LittleEndian.AppendUint32(dst, uint32(segments))
}

// AppendFence appends one fence of a Commit body and returns the extended slice.
func AppendFence(dst []byte, table uint32, epoch uint64) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, table)
	dst = binary.LittleEndian.AppendUint32(dst, 0)
	return binary.LittleEndian.AppendUint64(dst, epoch)
}

// AppendSegmentHeader appends the header of a segment of table's page with the given row size
// and masks (the rows follow it: popcount(data)*rowBytes bytes) and returns the extended
// slice. It is the one encoder of the header, for the wire and for the engine's WAL; it checks
// nothing (ValidateSegment does).
func AppendSegmentHeader(dst []byte, table uint32, rowBytes int, page, data, clear uint64) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, table)
	dst = append(dst, byte(rowBytes), byte(rowBytes>>8), 0, 0)
	dst = binary.LittleEndian.AppendUint64(dst, page)
	dst = binary.LittleEndian.AppendUint64(dst, data)
	return binary.LittleEndian.AppendUint64(dst, clear)
}

// PutSegmentHeader writes s's header into b[:SegmentHeaderBytes] (for an encoder that reserved
// the room, such as sgio's gathering Writer). It checks nothing.
func PutSegmentHeader(b []byte, s *base.Segment) {
	_ = b[SegmentHeaderBytes-1]
	binary.LittleEndian.PutUint32(b[0:], s.Table)
	binary.LittleEndian.PutUint16(b[4:], s.RowBytes)
	binary.LittleEndian.PutUint16(b[6:], 0)
	binary.LittleEndian.PutUint64(b[8:], s.Page)
	binary.LittleEndian.PutUint64(b[16:], s.Data)
	binary.LittleEndian.PutUint64(b[24:], s.Clear)
}

// AppendSegment appends s, header and rows (copied), to dst and returns the extended slice.
func AppendSegment(dst []byte, s *base.Segment) []byte {
	var h [SegmentHeaderBytes]byte
	PutSegmentHeader(h[:], s)
	return append(append(dst, h[:]...), s.Rows...)
}

// SegmentSize reports s's encoded size: header and rows.
func SegmentSize(s *base.Segment) int { return SegmentHeaderBytes + s.RowsSize() }

// SegmentsSize reports the encoded size of segs, back to back.
func SegmentsSize(segs []base.Segment) int {
	n := 0
	for i := range segs {
		n += SegmentSize(&segs[i])
	}
	return n
}

// Size reports the encoded size of a Commit body of n fences and the segments segs.
func Size(n int, segs []base.Segment) int {
	return HeaderBytes + FenceBytes*n + SegmentsSize(segs)
}
