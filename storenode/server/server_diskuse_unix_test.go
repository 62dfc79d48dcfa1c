//go:build unix

package server

import (
	"io/fs"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// An empty store, served and stopped, takes a few MiB of disk, not a whole WAL segment
// (measured in the file system's allocated blocks, preallocated ones included). Fails on
// 767c454: 64 MiB were reserved for the first segment at creation.
func TestEmptyStoreTakesLittleDisk(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	env := startServer(t, func(c *Config) { c.Options.Dir = dir })
	used := allocatedBytes(t, dir)
	require.Less(t, used, int64(8<<20), "a served empty store takes %d bytes on disk", used)
	require.NoError(t, env.srv.Shutdown(t.Context()))
	used = allocatedBytes(t, dir)
	require.Less(t, used, int64(8<<20), "a stopped empty store takes %d bytes on disk", used)
}

// allocatedBytes sums the blocks the file system allocated to the files under dir
// (st_blocks, 512-byte units), preallocated space beyond the end of a file included.
func allocatedBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var total int64
	require.NoError(t, filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
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
