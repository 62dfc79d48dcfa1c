//go:build unix

package wal

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/internal/testkit"
	"github.com/weftdb/weft/internal/vfs"
)

// An empty log takes one preallocation step of disk, not a whole segment: fails on 767c454
// (the 64 MiB segment was reserved at creation).
func TestEmptyLogTakesLittleDisk(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "wal")
	w, err := Open(vfs.Default, dir, Options{}, nil)
	require.NoError(t, err)
	used := testkit.AllocatedBytes(t, dir)
	require.Less(t, used, int64(8<<20), "an empty log's files take %d bytes on disk", used)
	require.NoError(t, w.Close())

	// Reopened, it stays small: recovery reserves one step ahead of the end, not a segment.
	w, err = Open(vfs.Default, dir, Options{}, nil)
	require.NoError(t, err)
	used = testkit.AllocatedBytes(t, dir)
	require.Less(t, used, int64(8<<20), "a reopened empty log's files take %d bytes on disk", used)
	require.NoError(t, w.Close())
}
