package wal

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/internal/vfs"
)

func TestAppendBatchIsOneGroupAndReadsBack(t *testing.T) {
	fsys := vfs.NewFaultFS()
	w, _ := mustOpen(t, fsys, Options{Sync: SyncNone, SegmentBytes: 1 << 10})
	ctx := context.Background()
	var want []rec
	for b := 0; b < 20; b++ {
		var recs []BatchRecord
		for k := 0; k < 1+b%5; k++ {
			n := uint64(len(want) + len(recs) + 1)
			p := payloadOf(n)
			recs = append(recs, BatchRecord{Kind: byte(n % 7), Payload: [][]byte{p[:len(p)/2], p[len(p)/2:]}})
		}
		groups := w.Stats().Groups
		first, err := w.AppendBatch(ctx, recs, b%3 == 0)
		require.NoError(t, err)
		require.Equal(t, uint64(len(want)+1), first)
		require.Equal(t, groups+1, w.Stats().Groups, "batch %d is one group", b)
		for i, r := range recs {
			want = append(want, rec{first + uint64(i), r.Kind, payloadOf(first + uint64(i))})
		}
	}
	last := w.LastLSN()
	require.Greater(t, len(segments(t, fsys)), 3, "the batches rolled segments")
	for _, from := range []uint64{1, 2, 17, last - 3, last} {
		var got []rec
		var pos []ReadFrom
		require.NoError(t, w.ReadRecords(ReadFrom{LSN: from}, last, func(r Record) (bool, error) {
			got = append(got, rec{r.LSN, r.Kind, append([]byte{}, r.Payload...)})
			pos = append(pos, ReadFrom{r.LSN, r.Segment, r.Offset})
			return true, nil
		}))
		require.Equal(t, want[from-1:], got, "from %d", from)
		// From a record's position: the same records, without reading its segment's start.
		for _, p := range pos[:min(len(pos), 4)] {
			var again []rec
			require.NoError(t, w.ReadRecords(p, last, func(r Record) (bool, error) {
				again = append(again, rec{r.LSN, r.Kind, append([]byte{}, r.Payload...)})
				return true, nil
			}))
			require.Equal(t, want[p.LSN-1:], again, "from %+v", p)
		}
	}
	// A position that is not the record's is refused.
	require.Error(t, w.ReadRecords(ReadFrom{LSN: 5, Segment: 1, Offset: 40}, last, func(Record) (bool, error) { return true, nil }))
	// Stopping early, and a range ending before the log does.
	var n int
	require.NoError(t, w.ReadRecords(ReadFrom{LSN: 3}, last, func(Record) (bool, error) { n++; return n < 4, nil }))
	require.Equal(t, 4, n)
	n = 0
	require.NoError(t, w.ReadRecords(ReadFrom{LSN: 3}, 9, func(Record) (bool, error) { n++; return true, nil }))
	require.Equal(t, 7, n)

	firsts, err := SegmentFirsts(fsys, testDir)
	require.NoError(t, err)
	require.Equal(t, uint64(1), firsts[0])
	require.NoError(t, w.DropBefore(firsts[2]))
	require.ErrorIs(t, w.ReadRecords(ReadFrom{LSN: 1}, last, func(Record) (bool, error) { return true, nil }), ErrDropped)
	require.NoError(t, w.Close())

	// Reopened after the drop: After below the oldest segment left.
	firsts, err = SegmentFirsts(fsys, testDir)
	require.NoError(t, err)
	_, got := mustOpen(t, fsys, Options{After: firsts[0] - 1})
	require.Equal(t, want[firsts[0]-1:], got)
}
