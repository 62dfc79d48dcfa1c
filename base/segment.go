package base

import "math/bits"

// Segment is a sparse segment of one logical page of one table: the unit of IO in both
// directions, in the commit batch and in the WAL.
//   - Data has a bit for each slot whose row follows in Rows, in slot order; Clear a bit for
//     each slot that is (or becomes) absent, carrying no bytes; Data&Clear == 0.
//   - Rows holds popcount(Data)*RowBytes bytes. Who made the segment owns them: a decoded
//     segment's Rows aliases its frame or record, an encoded one's is sent by reference and
//     must not change until the write completed.
//   - RowBytes is the row size its sender meant: the wire carries it and the server checks it
//     against the table; the engine reads Rows by the table's own geometry.
//   - A segment from outside the process (wire, WAL, data file) is checked before it is
//     applied (logicpage.Geometry.CheckSegment, commitbody's decoder).
type Segment struct {
	Table    uint32
	RowBytes uint16
	Page     uint64 // the logical page: row ids Page*64 ...
	Data     uint64
	Clear    uint64
	Rows     []byte
}

// RowsSize reports the number of row bytes the segment carries: popcount(Data)*RowBytes.
func (s *Segment) RowsSize() int { return bits.OnesCount64(s.Data) * int(s.RowBytes) }

// Fence names a table a commit batch writes and the ownership epoch its owner holds for it.
type Fence struct {
	Table uint32
	Epoch uint64
}

// PageWant is one page of a read: the slots of Page that the reader wants. The answer is one
// Segment, Data = Want&present and Clear = Want&^present.
type PageWant struct {
	Table uint32
	Page  uint64
	Want  uint64
}
