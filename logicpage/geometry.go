package logicpage

import (
	"fmt"
	"math"
	"math/bits"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/assert"
)

// Page geometry: part of the format; do not change.
//
// Row ids, page numbers, masks, segments, disk pages and the WAL all depend on these values;
// changing one changes the meaning of every byte already written.
const (
	// RowsPerPage is the number of rows in a logical page: one bit per slot in a uint64 mask.
	RowsPerPage = base.RowsPerPage
	// DiskPageAlign is the alignment and size granularity of a disk page, in bytes.
	DiskPageAlign = 4096
	// RowBytesMin is the smallest row size a table may have.
	RowBytesMin = 8
	// RowBytesMax is the largest row size a table may have (a logical page is then 256 KiB).
	RowBytesMax = 4096
	// RowBytesAlign is the granularity of row sizes: rows are copied as 64-bit words.
	RowBytesAlign = 8
)

const (
	// RowBytesDefault is the row size a table gets when its definition does not name one.
	RowBytesDefault = 64

	// PageMax is the largest page number the formats can name: the page of row id
	// math.MaxUint64. A page number above it cannot hold any row id, so a segment naming one
	// is corrupt. Tables are smaller: see TablePagesMax.
	PageMax = math.MaxUint64 / RowsPerPage

	// TablePagesMax is the number of logical pages a table may have: pages 0..2^30-1, row ids
	// below TableRowsMax = 2^36 (64 Gi rows). The storage engine packs (table, page) into one
	// uint64; a request naming a page at or beyond it fails with a malformed-request error,
	// and id grants stop below TableRowsMax. The single source of this limit: the engine,
	// the docs and the wire format's validation all say this number.
	TablePagesMax = 1 << 30
	// TableRowsMax is one past the largest row id a table can hold: TablePagesMax pages.
	TableRowsMax = TablePagesMax * RowsPerPage

	slotBits = 6 // log2(RowsPerPage)
	slotMask = RowsPerPage - 1
)

// Geometry is the layout of a table's logical pages for one row size. It is a small value: copy
// it freely, call its methods from any goroutine. The zero Geometry is not valid; build one with
// NewGeometry.
type Geometry struct {
	rowBytes int
}

// NewGeometry returns the geometry of rows of rowBytes bytes. rowBytes must lie in
// RowBytesMin..RowBytesMax and be a multiple of RowBytesAlign; otherwise the error wraps
// ErrRowSize.
func NewGeometry(rowBytes int) (Geometry, error) {
	if rowBytes < RowBytesMin || rowBytes > RowBytesMax || rowBytes%RowBytesAlign != 0 {
		return Geometry{}, fmt.Errorf("%w %d: want a multiple of %d in %d..%d",
			ErrRowSize, rowBytes, RowBytesAlign, RowBytesMin, RowBytesMax)
	}
	return Geometry{rowBytes: rowBytes}, nil
}

// RowBytes returns R, the size of one row in bytes.
func (g Geometry) RowBytes() int { return g.rowBytes }

// PageBytes returns the size of a logical page's rows: RowsPerPage*R bytes.
func (g Geometry) PageBytes() int { return RowsPerPage * g.rowBytes }

// DiskPageBytes returns the size of a disk page: PageBytes rounded up to a multiple of
// DiskPageAlign. A disk page holds row bytes only (no header); the tail past PageBytes is
// padding. It is 4096 for 64-byte rows and for any R up to 64.
func (g Geometry) DiskPageBytes() int {
	return (g.PageBytes() + DiskPageAlign - 1) &^ (DiskPageAlign - 1)
}

// RowOffset returns the byte offset of slot within a logical page (and within its disk page).
// slot must be in [0, RowsPerPage).
func (g Geometry) RowOffset(slot int) int {
	if uint(slot) >= RowsPerPage {
		assert.Failf("logicpage: slot %d out of range", slot)
	}
	return slot * g.rowBytes
}

// MaskBytes returns the number of row bytes that the set slots of mask occupy when packed
// contiguously, as in a segment: popcount(mask)*R. A decoder checks a length against it before
// it allocates or reads.
func (g Geometry) MaskBytes(mask uint64) int {
	return bits.OnesCount64(mask) * g.rowBytes
}

// PageOf returns the logical page and the slot of row id.
func PageOf(id uint64) (page uint64, slot int) {
	return id >> slotBits, int(id & slotMask)
}

// RowID returns the row id of slot in page. page must be at most PageMax and slot in
// [0, RowsPerPage).
func RowID(page uint64, slot int) uint64 {
	if uint(slot) >= RowsPerPage || page > PageMax {
		assert.Failf("logicpage: page %d slot %d out of range", page, slot)
	}
	return page<<slotBits | uint64(slot)
}
