package logicpage

import (
	"math/bits"
	"sync/atomic"

	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/internal/assert"
	"github.com/weftdb/weft/internal/corrupt"
)

// CheckSegment returns nil if s is well formed for rows of this geometry: Page at most PageMax,
// Data and Clear disjoint, and len(Rows) exactly popcount(Data)*R. An empty segment (both masks
// zero, no rows) is well formed. Otherwise the error wraps ErrSegment and corrupt.ErrCorruption:
// a segment that breaks these rules came from bad bytes. It allocates only when it fails.
func (g Geometry) CheckSegment(s base.Segment) error {
	if s.Page > PageMax {
		return corrupt.Errorf("%w: page %d beyond the last page %d", ErrSegment, s.Page, uint64(PageMax))
	}
	if both := s.Data & s.Clear; both != 0 {
		return corrupt.Errorf("%w: page %d: data mask %#016x and clear mask %#016x share slots %#016x",
			ErrSegment, s.Page, s.Data, s.Clear, both)
	}
	if want := g.MaskBytes(s.Data); len(s.Rows) != want {
		return corrupt.Errorf("%w: page %d: %d row bytes for %d data rows of %d bytes, want %d",
			ErrSegment, s.Page, len(s.Rows), bits.OnesCount64(s.Data), g.rowBytes, want)
	}
	return nil
}

// Gather appends to dst the bytes of the set slots of mask, in slot order, and returns the
// extended slice. Runs of adjacent slots come out as one slice (a full page is one slice, eight
// adjacent rows one slice), so a writev of many pages stays well under IOV_MAX: at most 32
// slices per page. It copies nothing: the slices alias the frame, must not be written while in
// use, and see any later change to the page; each one's capacity ends at its last row. Gather
// ignores the masks of the frame (a caller gathers what it wants, present or not) and allocates
// nothing when dst has room.
func (f Frame) Gather(mask uint64, dst [][]byte) [][]byte {
	r := f.g.rowBytes
	for mask != 0 {
		first := bits.TrailingZeros64(mask)
		n := bits.TrailingZeros64(^(mask >> first)) // length of the run of ones at first
		lo, hi := first*r, (first+n)*r
		dst = append(dst, f.Rows[lo:hi:hi])
		mask &^= runMask(first, n)
	}
	return dst
}

// Apply writes segment s into the frame: it copies each data row into its slot, sets
// Present |= s.Data and clears Present &^= s.Clear. It zeroes the bytes of cleared slots, so a
// frame whose absent slots start zero stays that way: a page's bytes are then a function of its
// present rows, and deleted rows do not linger in caches or on disk. It leaves Valid and Dirty
// alone.
//
// s must be well formed (CheckSegment); s.Page is not compared with anything, the frame does not
// know its page number. Apply writes with plain stores: the caller excludes concurrent readers
// and writers of the touched slots and of Masks.Present (see ApplyShared otherwise).
func (f Frame) Apply(s base.Segment) { f.applyOnly(s, ^uint64(0), false) }

// ApplyOnly is Apply restricted to the slots of into: data rows outside into are skipped (their
// bytes in s.Rows are stepped over), cleared slots outside into keep their bytes and present
// bits. It serves the transaction node's rule "a fill writes only slots still invalid", so a
// write that landed while a miss was in flight is not overwritten by older bytes.
func (f Frame) ApplyOnly(s base.Segment, into uint64) { f.applyOnly(s, into, false) }

// ApplyShared is Apply for a frame that other goroutines read lock-free: rows are written with
// StoreRow and cleared with atomic stores, and Present is updated with atomic OR and AND, so
// readers that use LoadRow and atomic loads of Present race with nothing. Rows and Present
// change word by word, not all at once: readers need a version check. It costs about one locked
// instruction per 8 bytes written (docs/logicpage.md, "Measured").
func (f Frame) ApplyShared(s base.Segment) { f.applyOnly(s, ^uint64(0), true) }

// ApplyOnlyShared is ApplyOnly with the writes of ApplyShared.
func (f Frame) ApplyOnlyShared(s base.Segment, into uint64) { f.applyOnly(s, into, true) }

// applyOnly is Apply, ApplyOnly and their shared forms. It walks runs of adjacent slots so that
// a full page is one copy. A run of slots of Data&into is also contiguous in s.Rows, starting
// after the popcount(Data) rows below its first slot.
func (f Frame) applyOnly(s base.Segment, into uint64, shared bool) {
	r := f.g.rowBytes
	if s.Data&s.Clear != 0 || len(s.Rows) != bits.OnesCount64(s.Data)*r {
		assert.Failf("logicpage: apply unchecked segment of page %d: data %#x clear %#x rows %d bytes, row size %d",
			s.Page, s.Data, s.Clear, len(s.Rows), r)
	}
	data := s.Data & into
	for m := data; m != 0; {
		first := bits.TrailingZeros64(m)
		n := bits.TrailingZeros64(^(m >> first))
		run := runMask(first, n)
		src := bits.OnesCount64(s.Data&(uint64(1)<<first-1)) * r // rows of Data below first
		dst := f.Rows[first*r : (first+n)*r]
		if shared {
			StoreRow(dst, s.Rows[src:src+n*r])
		} else {
			copy(dst, s.Rows[src:src+n*r])
		}
		m &^= run
	}
	cleared := s.Clear & into
	for m := cleared; m != 0; {
		first := bits.TrailingZeros64(m)
		n := bits.TrailingZeros64(^(m >> first))
		dst := f.Rows[first*r : (first+n)*r]
		if shared {
			zeroRowShared(dst)
		} else {
			clear(dst)
		}
		m &^= runMask(first, n)
	}
	if shared {
		atomic.OrUint64(&f.Masks.Present, data)
		atomic.AndUint64(&f.Masks.Present, ^cleared)
		return
	}
	f.Masks.Present = (f.Masks.Present | data) &^ cleared
}

// runMask returns the mask of n adjacent slots starting at first (n = 64 gives all slots; Go
// defines 1<<64 as 0 for a uint64).
func runMask(first, n int) uint64 {
	return (uint64(1)<<n - 1) << first
}
