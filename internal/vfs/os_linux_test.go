package vfs

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestDefaultErrorsKeepErrno(t *testing.T) {
	dir := t.TempDir()
	_, err := Default.Open(filepath.Join(dir, "missing"))
	var pathErr *os.PathError
	require.ErrorAs(t, err, &pathErr)
	require.ErrorIs(t, err, syscall.ENOENT)

	f, err := Default.Create(filepath.Join(dir, "f"))
	require.NoError(t, err)
	defer func() { require.NoError(t, f.Close()) }()
	err = f.Allocate(-1, 4096) // fallocate refuses a negative offset with EINVAL
	require.ErrorIs(t, err, syscall.EINVAL)
	require.ErrorAs(t, err, &pathErr)
	require.Equal(t, "fallocate", pathErr.Op)
	require.Equal(t, filepath.Join(dir, "f"), pathErr.Path)
}

// TestDefaultAppendFallback runs Write on the path for kernels without pwritev2(RWF_APPEND).
func TestDefaultAppendFallback(t *testing.T) {
	was := appendFallback.Load()
	appendFallback.Store(true)
	t.Cleanup(func() { appendFallback.Store(was) })
	f, err := Default.Create(filepath.Join(t.TempDir(), "log"))
	require.NoError(t, err)
	defer func() { require.NoError(t, f.Close()) }()
	_, err = f.Write([]byte("ab"))
	require.NoError(t, err)
	_, err = f.WriteAt([]byte("cd"), 2)
	require.NoError(t, err)
	_, err = f.Write([]byte("e"))
	require.NoError(t, err)
	require.Equal(t, []byte("abcde"), readAll(t, f))
}
