package commitbody

import (
	"encoding/hex"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/base"
)

// appendBody encodes a Commit body of owner, seq, fences and segs with the package's encoders,
// rows copied.
func appendBody(dst []byte, owner, seq uint64, fences []base.Fence, segs []base.Segment) []byte {
	dst = AppendHeader(dst, owner, seq, len(fences), len(segs))
	for _, f := range fences {
		dst = AppendFence(dst, f.Table, f.Epoch)
	}
	for i := range segs {
		dst = AppendSegment(dst, &segs[i])
	}
	return dst
}

// goldenBody is the Commit body of the golden frame in docs/wire.md (sgio's TestGoldenCommitFrame
// checks the whole frame against the document).
func goldenBody() (owner, seq uint64, fences []base.Fence, segs []base.Segment) {
	return 7, 3, []base.Fence{{Table: 1, Epoch: 5}, {Table: 2, Epoch: 9}}, []base.Segment{
		{Table: 1, RowBytes: 8, Page: 0, Data: 0b101, Clear: 0b010, Rows: []byte("slot-000slot-002")},
		{Table: 2, RowBytes: 16, Page: 3, Data: 1 << 63, Rows: []byte("page3-slot63-row")},
	}
}

func TestSegmentLayout(t *testing.T) {
	s := base.Segment{Table: 5, RowBytes: 8, Page: 2, Data: 0b101, Clear: 0b10, Rows: []byte("row-0000row-0002")}
	require.Equal(t, 16, s.RowsSize())
	require.Equal(t, SegmentHeaderBytes+16, SegmentSize(&s))
	require.NoError(t, ValidateSegment(&s))
	want := "05000000" + "0800" + "0000" + "0200000000000000" + "0500000000000000" + "0200000000000000" +
		hex.EncodeToString([]byte("row-0000row-0002"))
	require.Equal(t, want, hex.EncodeToString(AppendSegment(nil, &s)))
	// The header alone, from its fields, is the same bytes.
	require.Equal(t, want[:2*SegmentHeaderBytes], hex.EncodeToString(AppendSegmentHeader(nil, 5, 8, 2, 0b101, 0b10)))
	var h [SegmentHeaderBytes]byte
	PutSegmentHeader(h[:], &s)
	require.Equal(t, want[:2*SegmentHeaderBytes], hex.EncodeToString(h[:]))
}

// TestCommitBodyLayout: the golden body's fixed fields and fences, byte for byte as docs/wire.md
// shows them, and its size.
func TestCommitBodyLayout(t *testing.T) {
	owner, seq, fences, segs := goldenBody()
	body := appendBody(nil, owner, seq, fences, segs)
	want := "0700000000000000" + "0300000000000000" + "02000000" + "02000000" +
		"01000000" + "00000000" + "0500000000000000" +
		"02000000" + "00000000" + "0900000000000000"
	require.Equal(t, want, hex.EncodeToString(body[:HeaderBytes+2*FenceBytes]))
	require.Equal(t, len(body), Size(len(fences), segs))
	require.Equal(t, 2*SegmentHeaderBytes+32, SegmentsSize(segs))
	require.Zero(t, len(body)%8, "every part is a multiple of 8 bytes")
}
