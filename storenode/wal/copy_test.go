package wal

import (
	"bytes"
	"context"
	"path"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/internal/corrupt"
	"github.com/weftdb/weft/internal/vfs"
)

// copyTo copies w's records (after, through] into the files of a new FS's WAL directory.
func copyTo(t *testing.T, w *WAL, after, through uint64) (*vfs.FaultFS, error) {
	dst := vfs.NewFaultFS()
	require.NoError(t, dst.MkdirAll(testDir))
	files := map[uint64]vfs.File{}
	err := w.Copy(context.Background(), after, through, func(first uint64, off int64, b []byte) error {
		f, ok := files[first]
		if !ok {
			require.Zero(t, off, "a segment's first piece starts at 0")
			var err error
			f, err = dst.Create(path.Join(testDir, segmentName(first)))
			require.NoError(t, err)
			files[first] = f
		}
		_, err := f.WriteAt(bytes.Clone(b), off)
		return err
	})
	for _, f := range files {
		require.NoError(t, f.Sync())
		require.NoError(t, f.Close())
	}
	require.NoError(t, dst.SyncDir(testDir))
	return dst, err
}

func TestCopyRecordsAcrossSegments(t *testing.T) {
	fs := vfs.NewFaultFS()
	opts := Options{SegmentBytes: 4 << 10}
	w, _ := mustOpen(t, fs, opts)
	appendN(t, w, 1, 300)
	require.NoError(t, w.Sync())
	for _, c := range []struct{ after, through uint64 }{{0, 300}, {120, 250}, {250, 250}, {299, 300}} {
		dst, err := copyTo(t, w, c.after, c.through)
		require.NoError(t, err)
		o := opts
		o.After = c.after
		_, got, err := openCollectFS(t, dst, o)
		require.NoError(t, err, "%+v", c)
		requireRecords(t, got, c.after+1, c.through)
	}
	_, err := copyTo(t, w, 0, 301)
	require.Error(t, err, "records beyond the log")
}

func TestCopyRefusesDamagedRecord(t *testing.T) {
	fs := vfs.NewFaultFS()
	w, _ := mustOpen(t, fs, Options{})
	appendN(t, w, 1, 50)
	require.NoError(t, w.Sync())
	f, err := fs.Open(path.Join(testDir, segmentName(1)))
	require.NoError(t, err)
	_, err = f.WriteAt([]byte{0xee}, segmentHeaderSize+recordHeaderSize+3*64)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	_, err = copyTo(t, w, 0, 50)
	require.ErrorIs(t, err, corrupt.ErrCorruption)
}

func openCollectFS(t *testing.T, fsys vfs.FS, opts Options) (*WAL, []rec, error) {
	w, got, err := openCollect(t, fsys, opts)
	if err == nil {
		t.Cleanup(func() { _ = w.Close() })
	}
	return w, got, err
}
