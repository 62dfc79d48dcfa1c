package wal

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/internal/vfs"
)

// The reservation moves ahead of the write position as the segment fills, and stops at the
// segment's size: after every group the active segment is reserved at least to where the
// writes reached and at most one step beyond (FaultFS counts a reservation in Used).
func TestPreallocationFollowsTheWrites(t *testing.T) {
	fs := vfs.NewFaultFS()
	const segBytes = 12 << 20
	w, _ := mustOpen(t, fs, Options{SegmentBytes: segBytes, Sync: SyncNone})
	used := fs.Used()
	require.GreaterOrEqual(t, used, int64(preallocStep), "a new segment is reserved one step ahead")
	require.Less(t, used, int64(preallocStep+64<<10))

	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	payload := make([]byte, 256<<10)
	for i := range 80 { // 20 MiB: past the first segment into the second
		_, err := w.Append(ctx, 1, [][]byte{payload}, false)
		require.NoError(t, err)
		require.NoError(t, w.Sync()) // the writer has finished the group
		var segFiles int64
		for _, s := range segments(t, fs) {
			if s == segmentName(w.fileFirst) {
				continue
			}
			segFiles += segBytes + int64(len(payload)) + recordHeaderSize // a closed segment
		}
		active := w.fileOff // written by the writer, which Sync has waited for
		reserved := fs.Used()
		require.GreaterOrEqual(t, reserved, active, "append %d: the writes are not all counted", i)
		require.LessOrEqual(t, reserved, segFiles+max(active, min(active+preallocStep, segBytes))+64<<10,
			"append %d: %d bytes reserved for a segment written to %d", i, reserved, active)
	}
	require.Len(t, segments(t, fs), 2)
}
