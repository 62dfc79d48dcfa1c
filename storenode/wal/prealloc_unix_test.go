//go:build unix

package wal

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/internal/vfs"
)

// allocatedBytes sums the blocks the file system allocated to the files under dir
// (st_blocks, 512-byte units), preallocated space beyond the end of a file included.
func allocatedBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var total int64
	require.NoError(t, filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			t.Skip("no st_blocks on this platform")
		}
		total += st.Blocks * 512
		return nil
	}))
	return total
}

// An empty log takes one preallocation step of disk, not a whole segment: fails on 767c454
// (the 64 MiB segment was reserved at creation).
func TestEmptyLogTakesLittleDisk(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "wal")
	w, err := Open(vfs.Default, dir, Options{}, nil)
	require.NoError(t, err)
	used := allocatedBytes(t, dir)
	require.Less(t, used, int64(8<<20), "an empty log's files take %d bytes on disk", used)
	require.NoError(t, w.Close())

	// Reopened, it stays small: recovery reserves one step ahead of the end, not a segment.
	w, err = Open(vfs.Default, dir, Options{}, nil)
	require.NoError(t, err)
	used = allocatedBytes(t, dir)
	require.Less(t, used, int64(8<<20), "a reopened empty log's files take %d bytes on disk", used)
	require.NoError(t, w.Close())
}
