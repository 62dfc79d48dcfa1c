//go:build unix

package main

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestVerifyOddDirectories: the exit status of stores Open refuses or Check cannot read.
func TestVerifyOddDirectories(t *testing.T) {
	dir := filledDir(t, 100)

	// An unfinished backup: damage, exit 1.
	marker := filepath.Join(dir, "BACKUP-INCOMPLETE")
	require.NoError(t, os.WriteFile(marker, nil, 0o644))
	code, out, errOut := weft(t, "verify", dir)
	require.Equal(t, exitDamaged, code, "%s%s", out, errOut)
	require.Contains(t, out, "damage: BACKUP-INCOMPLETE: a backup into this directory did not finish")
	require.NoError(t, os.Remove(marker))

	// A FIFO for a lock file: the check cannot run (exit 3), at once.
	lock := filepath.Join(dir, "LOCK")
	require.NoError(t, os.Remove(lock))
	require.NoError(t, syscall.Mkfifo(lock, 0o644))
	code, out, errOut = weft(t, "verify", dir)
	require.Equal(t, exitUnchecked, code, "%s%s", out, errOut)
	require.Contains(t, errOut, "not a regular file")
}
