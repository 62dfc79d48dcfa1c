package vfs

import (
	"bytes"
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

// TestWriteVecAt writes gather lists (empty buffers, more buffers than one pwritev takes) to
// a real file and reads back their concatenation.
func TestWriteVecAt(t *testing.T) {
	f, err := Default.Create(filepath.Join(t.TempDir(), "v"))
	require.NoError(t, err)
	defer f.Close()
	var bufs [][]byte
	var want []byte
	for i := range 2500 {
		b := bytes.Repeat([]byte{byte(i)}, i%7)
		bufs = append(bufs, b)
		want = append(want, b...)
	}
	n, err := WriteVecAt(f, bufs, 100)
	require.NoError(t, err)
	require.Equal(t, len(want), n)
	got := make([]byte, len(want))
	_, err = f.ReadAt(got, 100)
	require.NoError(t, err)
	require.Equal(t, want, got)
	n, err = WriteVecAt(f, nil, 0)
	require.NoError(t, err)
	require.Zero(t, n)
}
