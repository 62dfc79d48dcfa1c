package logicpage

import (
	"testing"

	"github.com/weftdb/weft/base"
)

// benchExtractApply moves the rows of mask from one frame to another the way the IO path does:
// Gather into a reused slice list, land the slices contiguously in a reused buffer (what the
// wire and the decoder do between two nodes), Apply (or ApplyShared) the segment. The copy into
// the buffer is part of the measured work.
func benchExtractApply(b *testing.B, mask uint64, shared bool) {
	g := mustGeometry(b, 64)
	src, dst := newFrame(b, g), newFrame(b, g)
	for i := range src.Rows {
		src.Rows[i] = byte(i)
	}
	slices := make([][]byte, 0, 32)
	wire := make([]byte, 0, g.PageBytes())
	b.SetBytes(int64(g.MaskBytes(mask)))
	b.ReportAllocs()
	for b.Loop() {
		slices = src.Gather(mask, slices[:0])
		wire = wire[:0]
		for _, s := range slices {
			wire = append(wire, s...)
		}
		s := base.Segment{Page: 1, Data: mask, Rows: wire}
		if shared {
			dst.ApplyShared(s)
		} else {
			dst.Apply(s)
		}
	}
}

// benchMasks are the shapes measured: one row, eight adjacent rows (one slice), a full page
// (one slice), and the worst case for coalescing, every other slot (32 slices).
var benchMasks = []struct {
	name string
	mask uint64
}{
	{"rows=1", 1 << 17},
	{"rows=8", 0xff << 16},
	{"rows=64", ^uint64(0)},
	{"rows=32/layout=spread", 0x5555555555555555},
}

// BenchmarkExtractApply is extract plus apply with plain stores (the storage node's caches).
func BenchmarkExtractApply(b *testing.B) {
	for _, m := range benchMasks {
		b.Run(m.name, func(b *testing.B) { benchExtractApply(b, m.mask, false) })
	}
}

// BenchmarkExtractApplyShared is the same with ApplyShared (the transaction node's cache, read
// lock-free): the price of atomic stores, side by side with BenchmarkExtractApply.
func BenchmarkExtractApplyShared(b *testing.B) {
	for _, m := range benchMasks {
		b.Run(m.name, func(b *testing.B) { benchExtractApply(b, m.mask, true) })
	}
}

// BenchmarkGather is extract alone: the encoder's cost per page before writev.
func BenchmarkGather(b *testing.B) {
	g := mustGeometry(b, 64)
	f := newFrame(b, g)
	slices := make([][]byte, 0, 32)
	for _, m := range benchMasks {
		b.Run(m.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				slices = f.Gather(m.mask, slices[:0])
			}
		})
	}
}

// BenchmarkCheckSegment is the decoder's validation per segment.
func BenchmarkCheckSegment(b *testing.B) {
	g := mustGeometry(b, 64)
	s := base.Segment{Page: 1, Data: 0xff << 8, Clear: 1, Rows: make([]byte, 8*64)}
	b.ReportAllocs()
	for b.Loop() {
		if err := g.CheckSegment(s); err != nil {
			b.Fatal(err)
		}
	}
}
