package logicpage

import (
	"encoding/binary"
	"sync/atomic"
	"unsafe"

	"github.com/weftdb/weft/internal/assert"
)

// Invariants of a Frame:
//   - len(Rows) == PageBytes of its geometry, and &Rows[0] is 8-byte aligned, so every row
//     starts on a 64-bit word and can be copied with 64-bit atomics.
//   - Masks is never nil. Frame methods change only Masks.Present; Valid and Dirty belong to
//     the caller (the transaction node's cache), which knows when bytes become valid or clean.
//   - A Frame holds no memory of its own: Rows and Masks live in caller-owned slabs (a []uint64
//     viewed through AlignedBytes, a []Masks), so a cache of a million frames is a handful of
//     pointer-free allocations that the garbage collector never scans.

// Masks are the per-page bitmaps: bit s describes slot s. It is a plain struct with no pointers
// so a cache can keep one []Masks slab for all its pages.
type Masks struct {
	// Present has a bit set for each row that exists.
	Present uint64
	// Valid has a bit set for each row whose bytes are in this cache (transaction node only).
	Valid uint64
	// Dirty has a bit set for each row changed and not yet sent to the storage node.
	Dirty uint64
}

// Frame is a view of one logical page in caller-owned memory: the page's rows and its masks.
// It is a small value (copy it freely) that aliases Rows and *Masks; it is valid as long as the
// caller keeps that memory for this page.
//
// Row and Gather only slice Rows and may be called from any goroutine. Apply and ApplyOnly
// write rows and Masks.Present with plain stores: the caller excludes every other reader and
// writer of the slots they touch. ApplyShared and ApplyOnlyShared are for frames that other
// goroutines read lock-free with LoadRow (the transaction node's cache): they write through
// StoreRow and update Present atomically.
type Frame struct {
	// Rows holds the page's RowsPerPage rows, slot s at [s*R, (s+1)*R).
	Rows []byte
	// Masks are the page's present, valid and dirty bits.
	Masks *Masks

	g Geometry
}

// Frame returns the frame over rows and m. rows must be exactly PageBytes long and 8-byte
// aligned (see AlignedBytes); m must not be nil. It allocates nothing.
func (g Geometry) Frame(rows []byte, m *Masks) Frame {
	if g.rowBytes == 0 || len(rows) != g.PageBytes() || m == nil || !aligned(rows) {
		// m != nil, not m: boxing the pointer would make every caller's Masks escape.
		assert.Failf("logicpage: frame of %d bytes (want %d, 8-aligned), masks given %t, for row size %d",
			len(rows), g.PageBytes(), m != nil, g.rowBytes)
	}
	return Frame{Rows: rows, Masks: m, g: g}
}

// Geometry returns the geometry the frame was built with.
func (f Frame) Geometry() Geometry { return f.g }

// Row returns the R bytes of slot, aliasing the frame: writes through it change the page. Its
// capacity ends at the row, so an append cannot spill into the next slot. slot must be in
// [0, RowsPerPage).
func (f Frame) Row(slot int) []byte {
	lo := f.g.RowOffset(slot)
	hi := lo + f.g.rowBytes
	return f.Rows[lo:hi:hi]
}

// AlignedBytes allocates n zeroed bytes whose first byte is 8-byte aligned and returns them. The
// memory is allocated as a []uint64 and viewed as bytes, so it holds no pointers and the garbage
// collector does not scan it; the returned slice keeps it alive. Use it for frame slabs and for
// any buffer that LoadRow or StoreRow treat as shared. (make([]byte, n) is 8-aligned too in
// today's Go for n >= 8, but that is an implementation detail; this is a guarantee.)
func AlignedBytes(n int) []byte {
	if n < 0 {
		assert.Failf("logicpage: aligned bytes %d < 0", n)
	}
	words := make([]uint64, (n+7)/8)
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(words))), n)
}

// LoadRow copies src into dst with one 64-bit atomic load per word of src, so a reader may copy
// a row that a writer is storing with StoreRow at the same time: the race detector sees no race,
// and each 8-byte word of dst is either the old or the new word of src. The row as a whole may
// mix old and new words: the caller detects that with a version check around the copy.
//
// src is the shared side: it must be 8-byte aligned and a multiple of 8 bytes long. dst is the
// caller's private buffer: any alignment, the same length as src. It allocates nothing.
func LoadRow(dst, src []byte) {
	s := sharedWords(src)
	if len(dst) != len(src) {
		assert.Failf("logicpage: load row into %d bytes from %d", len(dst), len(src))
	}
	// Eight words (one 64-byte row) per iteration through fixed-size array views, so the
	// compiler checks bounds once per block instead of once per word.
	for len(s) >= 8 {
		w := (*[8]uint64)(s)
		d := (*[64]byte)(dst)
		binary.NativeEndian.PutUint64(d[0:], atomic.LoadUint64(&w[0]))
		binary.NativeEndian.PutUint64(d[8:], atomic.LoadUint64(&w[1]))
		binary.NativeEndian.PutUint64(d[16:], atomic.LoadUint64(&w[2]))
		binary.NativeEndian.PutUint64(d[24:], atomic.LoadUint64(&w[3]))
		binary.NativeEndian.PutUint64(d[32:], atomic.LoadUint64(&w[4]))
		binary.NativeEndian.PutUint64(d[40:], atomic.LoadUint64(&w[5]))
		binary.NativeEndian.PutUint64(d[48:], atomic.LoadUint64(&w[6]))
		binary.NativeEndian.PutUint64(d[56:], atomic.LoadUint64(&w[7]))
		s, dst = s[8:], dst[64:]
	}
	for i := range s {
		binary.NativeEndian.PutUint64(dst[8*i:], atomic.LoadUint64(&s[i]))
	}
}

// StoreRow copies src into dst with one 64-bit atomic store per word of dst, so readers may
// LoadRow dst at the same time (see LoadRow). It is not all-or-nothing: a concurrent reader can
// see some words new and some old.
//
// dst is the shared side: it must be 8-byte aligned and a multiple of 8 bytes long. src is the
// caller's private buffer: any alignment, the same length as dst. It allocates nothing. An
// atomic store is a locked instruction on amd64 (XCHG), several times dearer than a plain copy:
// use it only on memory that lock-free readers share.
func StoreRow(dst, src []byte) {
	d := sharedWords(dst)
	if len(dst) != len(src) {
		assert.Failf("logicpage: store row of %d bytes into %d", len(src), len(dst))
	}
	for i := range d {
		atomic.StoreUint64(&d[i], binary.NativeEndian.Uint64(src[8*i:]))
	}
}

// zeroRowShared zeroes the shared row dst with atomic stores.
func zeroRowShared(dst []byte) {
	d := sharedWords(dst)
	for i := range d {
		atomic.StoreUint64(&d[i], 0)
	}
}

// sharedWords views b, memory that lock-free readers and writers share, as 64-bit words. b must
// be 8-byte aligned and a multiple of 8 bytes long: an atomic on a misaligned word is not atomic
// (and faults on some CPUs).
func sharedWords(b []byte) []uint64 {
	if len(b)%8 != 0 || !aligned(b) {
		// The address as a number: boxing the pointer would make every caller's rows escape.
		assert.Failf("logicpage: shared row of %d bytes at %#x is not 8-byte aligned words",
			len(b), uintptr(unsafe.Pointer(unsafe.SliceData(b))))
	}
	return unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/8)
}

// aligned reports whether b starts on an 8-byte boundary. An empty slice is aligned.
func aligned(b []byte) bool {
	return len(b) == 0 || uintptr(unsafe.Pointer(unsafe.SliceData(b)))%8 == 0
}
