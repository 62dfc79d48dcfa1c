package commitbody

import (
	"encoding/binary"
	"fmt"

	"github.com/weftdb/weft/base"
)

// View is a checked, allocation-free view of a Commit body. Its fences and segments alias the
// body: valid as long as the body is (for a frame, until its buffer is discarded). Its methods
// only read, so any number of goroutines may call them.
type View struct {
	Owner  uint64
	Seq    uint64
	fences []byte
	segs   SegmentIter
}

// Decode checks a whole Commit body (the package's rules) and returns a view of it. It
// allocates nothing (except on failure). Any goroutine may call it; it only reads body.
func Decode(body []byte) (View, error) {
	if len(body) < HeaderBytes {
		return View{}, truncatedError(body, 0, HeaderBytes)
	}
	var v View
	v.Owner = binary.LittleEndian.Uint64(body[0:])
	v.Seq = binary.LittleEndian.Uint64(body[8:])
	nf := uint64(binary.LittleEndian.Uint32(body[16:]))
	ns := uint64(binary.LittleEndian.Uint32(body[20:]))
	// The counts against the bytes left, before any element is read.
	if left := uint64(len(body) - HeaderBytes); nf*FenceBytes+ns*SegmentHeaderBytes > left {
		return View{}, fmt.Errorf("commitbody: %d fences and %d segments do not fit in %d bytes: %w", nf, ns, left, base.ErrTruncated)
	}
	off := HeaderBytes + int(nf)*FenceBytes
	v.fences = body[HeaderBytes:off:off]
	for i := 4; i < len(v.fences); i += FenceBytes {
		if binary.LittleEndian.Uint32(v.fences[i:]) != 0 {
			return View{}, fmt.Errorf("commitbody: fence at offset %d: reserved field not zero: %w", HeaderBytes+i-4, base.ErrMalformed)
		}
	}
	var err error
	if v.segs, off, err = WalkSegments(body, off, int(ns)); err != nil {
		return View{}, err
	}
	if off != len(body) {
		return View{}, fmt.Errorf("commitbody: %d trailing bytes at offset %d: %w", len(body)-off, off, base.ErrMalformed)
	}
	return v, nil
}

// FenceCount reports the number of fences.
func (v *View) FenceCount() int { return len(v.fences) / FenceBytes }

// Fence reports fence i, 0 <= i < FenceCount.
func (v *View) Fence(i int) base.Fence {
	b := v.fences[i*FenceBytes : (i+1)*FenceBytes]
	return base.Fence{Table: binary.LittleEndian.Uint32(b), Epoch: binary.LittleEndian.Uint64(b[8:])}
}

// SegmentCount reports the number of segments.
func (v *View) SegmentCount() int { return v.segs.Len() }

// Segments returns a new iterator over the segments, from the first.
func (v *View) Segments() SegmentIter { return v.segs }
