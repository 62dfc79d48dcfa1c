package sgio

import (
	"encoding/hex"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/base"
)

func TestSegmentLayout(t *testing.T) {
	s := base.Segment{Table: 5, RowBytes: 8, Page: 2, Data: 0b101, Clear: 0b10, Rows: []byte("row-0000row-0002")}
	require.Equal(t, 16, s.RowsSize())
	require.Equal(t, SegmentHeaderSize+16, SegmentSize(&s))
	require.NoError(t, ValidateSegment(&s))
	want := "05000000" + "0800" + "0000" + "0200000000000000" + "0500000000000000" + "0200000000000000" +
		hex.EncodeToString([]byte("row-0000row-0002"))
	require.Equal(t, want, hex.EncodeToString(AppendSegment(nil, &s)))
}

func TestSegmentValidate(t *testing.T) {
	ok := base.Segment{Table: 1, RowBytes: 64, Page: PageMax, Data: 1 << 63, Rows: make([]byte, 64)}
	require.NoError(t, ValidateSegment(&ok))
	empty := base.Segment{Table: 1, RowBytes: 64}
	require.NoError(t, ValidateSegment(&empty), "no rows, nothing cleared: harmless")

	bad := ok
	bad.Rows = bad.Rows[:56]
	require.ErrorIs(t, ValidateSegment(&bad), ErrBadRowSize)
	bad = ok
	bad.Clear = 1 << 63
	require.ErrorIs(t, ValidateSegment(&bad), ErrMalformed)
	bad = ok
	bad.Page = PageMax + 1
	require.ErrorIs(t, ValidateSegment(&bad), ErrMalformed)
	bad = ok
	bad.RowBytes = 4097
	require.ErrorIs(t, ValidateSegment(&bad), ErrBadRowSize)
}

// A full page of 4096-byte rows is the largest segment: 256 KiB of rows.
func TestSegmentLargest(t *testing.T) {
	s := base.Segment{Table: 1, RowBytes: RowBytesMax, Data: ^uint64(0), Rows: make([]byte, RowsPerPage*RowBytesMax)}
	require.NoError(t, ValidateSegment(&s))
	body := (&Segments{Segments: []base.Segment{s}}).AppendBody(nil)
	var got Segments
	require.NoError(t, got.Parse(body))
	require.Len(t, got.Segments[0].Rows, 256<<10)
}
