package bench

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/internal/vfs"
)

func TestCountingFSCountsOnlyTheWAL(t *testing.T) {
	dir := t.TempDir()
	fs := newCountingFS(vfs.Default, filepath.Join(dir, "wal"))
	require.NoError(t, fs.MkdirAll(filepath.Join(dir, "wal")))
	w, err := fs.Create(filepath.Join(dir, "wal", "seg.log"))
	require.NoError(t, err)
	_, err = w.Write(make([]byte, 100))
	require.NoError(t, err)
	_, err = w.WriteAt(make([]byte, 28), 200)
	require.NoError(t, err)
	require.NoError(t, w.Close())
	d, err := fs.Create(filepath.Join(dir, "walrus.dat")) // a prefix of the name, not the dir
	require.NoError(t, err)
	_, err = d.WriteAt(make([]byte, 4096), 0)
	require.NoError(t, err)
	require.NoError(t, d.Close())
	require.Equal(t, uint64(128), fs.walBytes.Load())
}
