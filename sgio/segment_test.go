package sgio

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/base"
	"github.com/weftdb/weft/commitbody"
)

// A full page of 4096-byte rows is the largest segment: 256 KiB of rows.
func TestSegmentLargest(t *testing.T) {
	s := base.Segment{Table: 1, RowBytes: RowBytesMax, Data: ^uint64(0), Rows: make([]byte, RowsPerPage*RowBytesMax)}
	require.NoError(t, commitbody.ValidateSegment(&s))
	body := (&Segments{Segments: []base.Segment{s}}).AppendBody(nil)
	var got Segments
	require.NoError(t, got.Parse(body))
	require.Len(t, got.Segments[0].Rows, 256<<10)
}
