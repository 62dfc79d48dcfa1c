package vfs

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// writevLimitEnv runs TestWriteVecAtShort's child: the file size limit is process-wide.
const writevLimitEnv = "WEFT_WRITEV_LIMIT_CHILD"

// TestWriteVecAtShort: pwritev cut short by the file size limit (RLIMIT_FSIZE: the kernel
// writes up to the limit, then refuses with EFBIG) reports the bytes written with the error,
// and those bytes are the gather list's prefix. Run in a child process.
func TestWriteVecAtShort(t *testing.T) {
	if dir := os.Getenv(writevLimitEnv); dir != "" {
		writeVecAtShortChild(t, dir)
		return
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestWriteVecAtShort$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), writevLimitEnv+"="+dir)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "child:\n%s", out)
	require.Contains(t, string(out), "--- PASS: TestWriteVecAtShort", "child:\n%s", out)
}

func writeVecAtShortChild(t *testing.T, dir string) {
	const limit = 10000
	require.NoError(t, syscall.Setrlimit(syscall.RLIMIT_FSIZE, &syscall.Rlimit{Cur: limit, Max: limit}))
	f, err := Default.Create(filepath.Join(dir, "v"))
	require.NoError(t, err)
	defer f.Close()
	var bufs [][]byte
	var want []byte
	for i := range 300 {
		b := bytes.Repeat([]byte{byte(i)}, 1+i%97)
		bufs = append(bufs, b, nil)
		want = append(want, b...)
	}
	require.Greater(t, len(want), limit)
	n, err := WriteVecAt(f, bufs, 100)
	require.ErrorIs(t, err, syscall.EFBIG)
	require.Equal(t, limit-100, n)
	got := make([]byte, n)
	_, err = f.ReadAt(got, 100)
	require.NoError(t, err)
	require.Equal(t, want[:n], got)
}
