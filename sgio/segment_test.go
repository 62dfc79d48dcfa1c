package sgio

import (
	"encoding/hex"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSegmentLayout(t *testing.T) {
	s := Segment{Table: 5, RowBytes: 8, Page: 2, Data: 0b101, Clear: 0b10, Rows: []byte("row-0000row-0002")}
	require.Equal(t, 16, s.RowsSize())
	require.Equal(t, SegmentHeaderSize+16, s.Size())
	require.NoError(t, s.Validate())
	want := "05000000" + "0800" + "0000" + "0200000000000000" + "0500000000000000" + "0200000000000000" +
		hex.EncodeToString([]byte("row-0000row-0002"))
	require.Equal(t, want, hex.EncodeToString(AppendSegment(nil, &s)))
}

func TestSegmentValidate(t *testing.T) {
	ok := Segment{Table: 1, RowBytes: 64, Page: PageMax, Data: 1 << 63, Rows: make([]byte, 64)}
	require.NoError(t, ok.Validate())
	empty := Segment{Table: 1, RowBytes: 64}
	require.NoError(t, empty.Validate(), "no rows, nothing cleared: harmless")

	bad := ok
	bad.Rows = bad.Rows[:56]
	require.ErrorIs(t, bad.Validate(), ErrBadRowSize)
	bad = ok
	bad.Clear = 1 << 63
	require.ErrorIs(t, bad.Validate(), ErrMalformed)
	bad = ok
	bad.Page = PageMax + 1
	require.ErrorIs(t, bad.Validate(), ErrMalformed)
	bad = ok
	bad.RowBytes = 4097
	require.ErrorIs(t, bad.Validate(), ErrBadRowSize)
}

// A full page of 4096-byte rows is the largest segment: 256 KiB of rows.
func TestSegmentLargest(t *testing.T) {
	s := Segment{Table: 1, RowBytes: RowBytesMax, Data: ^uint64(0), Rows: make([]byte, RowsPerPage*RowBytesMax)}
	require.NoError(t, s.Validate())
	body := (&Segments{Segments: []Segment{s}}).AppendBody(nil)
	var got Segments
	require.NoError(t, got.Parse(body))
	require.Len(t, got.Segments[0].Rows, 256<<10)
}
