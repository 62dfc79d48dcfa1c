package wal

import (
	"bytes"
	"path"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/internal/corrupt"
	"github.com/weftdb/weft/internal/vfs"
)

// FuzzDecodeRecord feeds arbitrary bytes to the record decoder: it never panics, every error
// wraps corrupt.ErrCorruption, and what it accepts encodes back to the same bytes.
func FuzzDecodeRecord(f *testing.F) {
	f.Add(encodeRecord(1, 0, 0, nil))
	f.Add(encodeRecord(7, 5, 3, []byte("hello, wal")))
	f.Add(encodeRecord(1<<40, 1<<40-1, 255, bytes.Repeat([]byte{0xff}, 100)))
	f.Add(encodeRecord(2, 1, 1, []byte("cut"))[:20])
	f.Add(make([]byte, recordHeaderSize))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 1, 2, 3, 4})
	f.Fuzz(func(t *testing.T, data []byte) {
		const payloadBytesMax = 1 << 16
		h, payload, size, err := decodeRecord(data, payloadBytesMax)
		if err != nil {
			require.ErrorIs(t, err, corrupt.ErrCorruption)
			return
		}
		require.LessOrEqual(t, size, len(data))
		require.LessOrEqual(t, len(payload), payloadBytesMax)
		require.Equal(t, data[:size], encodeRecord(h.lsn, h.syncedThrough, h.kind, payload))
	})
}

// FuzzRecoverSegment opens a log whose only segment holds a good header and arbitrary bytes:
// Open never panics and either fails with corruption or recovers a consecutive prefix that
// appends continue.
func FuzzRecoverSegment(f *testing.F) {
	var good []byte
	for n := uint64(1); n <= 4; n++ {
		good = append(good, encodeRecord(n, n-1, 1, payloadOf(n))...)
	}
	f.Add(good)
	f.Add(good[:len(good)-5])
	f.Add(append(bytes.Clone(good[:40]), good[80:]...))
	f.Add(append(bytes.Clone(good), make([]byte, 64)...))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		fs := vfs.NewFaultFS()
		require.NoError(t, fs.MkdirAll(testDir))
		hdr := make([]byte, segmentHeaderSize)
		encodeSegmentHeader(hdr, 1)
		require.NoError(t, fs.WriteFile(path.Join(testDir, segmentName(1)), append(hdr, data...)))
		w, got, err := openCollect(t, fs, Options{MaxRecordBytes: 1 << 16})
		if err != nil {
			require.ErrorIs(t, err, corrupt.ErrCorruption)
			return
		}
		for i, r := range got {
			require.Equal(t, uint64(i+1), r.LSN)
		}
		n := uint64(len(got))
		lsn, err := w.Append(t.Context(), 9, [][]byte{[]byte("next")}, false)
		require.NoError(t, err)
		require.Equal(t, n+1, lsn)
		require.NoError(t, w.Close())
		w, again, err := openCollect(t, fs, Options{MaxRecordBytes: 1 << 16})
		require.NoError(t, err)
		require.Len(t, again, int(n+1))
		require.Equal(t, []byte("next"), again[n].Payload)
		require.NoError(t, w.Close())
	})
}
