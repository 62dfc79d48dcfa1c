//go:build !race

package commitbody

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/base"
)

// The hot paths allocate nothing once warm: encoding into a buffer with room, and decoding
// and walking a body.
func TestHotPathsDoNotAllocate(t *testing.T) {
	owner, seq, fences, segs := goldenBody()
	body := appendBody(nil, owner, seq, fences, segs)
	dst := make([]byte, 0, len(body))
	require.Zero(t, testing.AllocsPerRun(100, func() { dst = appendBody(dst[:0], owner, seq, fences, segs) }),
		"AppendHeader + AppendFence + AppendSegment")

	decode := func() {
		v, err := Decode(body)
		if err != nil {
			panic(err)
		}
		for i := range v.FenceCount() {
			_ = v.Fence(i)
		}
		var s base.Segment
		it := v.Segments()
		for it.Next(&s) {
		}
	}
	require.Zero(t, testing.AllocsPerRun(100, decode), "Decode + SegmentIter")
}
