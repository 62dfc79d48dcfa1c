//go:build !race

package logicpage

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/base"
)

// TestHotPathsDoNotAllocate guards the paths the caches run per row. The race detector's
// instrumentation allocates, hence the build tag.
func TestHotPathsDoNotAllocate(t *testing.T) {
	g := mustGeometry(t, 64)
	src, dst := newFrame(t, g), newFrame(t, g)
	slices := make([][]byte, 0, 32)
	full := base.Segment{Data: ^uint64(0), Rows: make([]byte, g.PageBytes())}
	sparse := base.Segment{Data: 0x5555555555555555, Clear: 0x2222222222222222, Rows: make([]byte, g.MaskBytes(0x5555555555555555))}
	row := make([]byte, 64)

	tests := []struct {
		name string
		fn   func()
	}{
		{"NewGeometry", func() { _, _ = NewGeometry(64) }},
		{"Frame", func() { _ = g.Frame(src.Rows, src.Masks) }},
		{"Row", func() { _ = src.Row(17) }},
		{"PageOf RowID", func() { p, s := PageOf(123456789); _ = RowID(p, s) }},
		{"Gather full", func() { slices = src.Gather(^uint64(0), slices[:0]) }},
		{"Gather spread", func() { slices = src.Gather(0x5555555555555555, slices[:0]) }},
		{"CheckSegment", func() { _ = g.CheckSegment(sparse) }},
		{"Apply", func() { dst.Apply(full); dst.Apply(sparse) }},
		{"ApplyOnly", func() { dst.ApplyOnly(sparse, 0xf0f0f0f0f0f0f0f0) }},
		{"ApplyShared", func() { dst.ApplyShared(sparse) }},
		{"ApplyOnlyShared", func() { dst.ApplyOnlyShared(sparse, 0xf0f0f0f0f0f0f0f0) }},
		{"LoadRow", func() { LoadRow(row, src.Row(3)) }},
		{"StoreRow", func() { StoreRow(dst.Row(3), row) }},
	}
	for _, tt := range tests {
		require.Zero(t, testing.AllocsPerRun(100, tt.fn), tt.name)
	}
}
