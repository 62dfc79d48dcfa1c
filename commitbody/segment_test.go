package commitbody

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/logicpage"
)

func TestSegmentValidate(t *testing.T) {
	ok := base.Segment{Table: 1, RowBytes: 64, Page: PageMax, Data: 1 << 63, Rows: make([]byte, 64)}
	require.NoError(t, ValidateSegment(&ok))
	empty := base.Segment{Table: 1, RowBytes: 64}
	require.NoError(t, ValidateSegment(&empty), "no rows, nothing cleared: harmless")

	bad := ok
	bad.Rows = bad.Rows[:56]
	require.ErrorIs(t, ValidateSegment(&bad), base.ErrBadRowSize)
	bad = ok
	bad.Clear = 1 << 63
	require.ErrorIs(t, ValidateSegment(&bad), base.ErrMalformed)
	bad = ok
	bad.Page = PageMax + 1
	require.ErrorIs(t, ValidateSegment(&bad), base.ErrMalformed)
	bad = ok
	bad.RowBytes = 4097
	require.ErrorIs(t, ValidateSegment(&bad), base.ErrBadRowSize)

	// Rows held elsewhere (a gather list of runs) are counted, not read.
	require.NoError(t, ValidateSegmentRows(&ok, 64))
	require.ErrorIs(t, ValidateSegmentRows(&ok, 128), base.ErrBadRowSize)
}

// Moved from sgio's TestCheckName with the check.
func TestCheckRowBytes(t *testing.T) {
	for _, ok := range []int{8, 16, 64, 4096} {
		require.NoError(t, CheckRowBytes(ok))
	}
	for _, bad := range []int{0, 7, 9, 4095, 4104, -8} {
		require.ErrorIs(t, CheckRowBytes(bad), base.ErrBadRowSize, "%d", bad)
	}
}

// TestRowBytesAreLogicpages ties the segment's row size check to logicpage's geometry, its one
// definition, for every size around the bounds (moved from sgio's TestLimitsAreLogicpages).
func TestRowBytesAreLogicpages(t *testing.T) {
	require.EqualValues(t, logicpage.PageMax, PageMax)
	require.EqualValues(t, logicpage.RowBytesMin, RowBytesMin)
	require.EqualValues(t, logicpage.RowBytesMax, RowBytesMax)
	for n := -8; n <= RowBytesMax+64; n++ {
		_, geoErr := logicpage.NewGeometry(n)
		wireErr := CheckRowBytes(n)
		require.Equal(t, geoErr == nil, wireErr == nil, "row size %d: logicpage %v, commitbody %v", n, geoErr, wireErr)
		require.True(t, wireErr == nil || errors.Is(wireErr, base.ErrBadRowSize))
	}
}

// A full page of 4096-byte rows is the largest segment: 256 KiB of rows.
func TestWalkSegmentsLargest(t *testing.T) {
	s := base.Segment{Table: 1, RowBytes: RowBytesMax, Data: ^uint64(0), Rows: make([]byte, logicpage.RowsPerPage*RowBytesMax)}
	require.NoError(t, ValidateSegment(&s))
	b := AppendSegment(make([]byte, 8), &s) // after 8 bytes of something else
	it, end, err := WalkSegments(b, 8, 1)
	require.NoError(t, err)
	require.Equal(t, len(b), end)
	var got base.Segment
	require.True(t, it.Next(&got))
	require.Len(t, got.Rows, 256<<10)
	require.False(t, it.Next(&got))
	var zero SegmentIter
	require.False(t, zero.Next(&base.Segment{}))
}
