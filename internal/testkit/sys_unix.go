//go:build unix

package testkit

import (
	"io/fs"
	"syscall"
	"testing"
	"time"
)

// AllocatedBytes sums the blocks the file system allocated to the files under dir (st_blocks,
// 512-byte units), preallocated space beyond the end of a file included. It skips the test
// where the file system reports no st_blocks.
func AllocatedBytes(t testing.TB, dir string) int64 {
	t.Helper()
	var total int64
	walkInfo(t, dir, func(_ string, fi fs.FileInfo) error {
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			t.Skip("no st_blocks on this platform")
		}
		total += st.Blocks * 512
		return nil
	})
	return total
}

// ProcessCPU is the process's user and system CPU time so far (0 if the system cannot say):
// a benchmark's cost per op on a machine whose other processes take cores from it, where
// its wall-clock ns/op measures only its share.
func ProcessCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
