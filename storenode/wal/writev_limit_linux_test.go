package wal

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/internal/vfs"
)

// pwritevLimitEnv runs TestKeptWriteCutShort's child: the file size limit is process-wide.
const pwritevLimitEnv = "WEFT_WAL_PWRITEV_LIMIT_CHILD"

// TestKeptWriteCutShort: a group with kept pieces whose pwritev the kernel cuts short (the
// file size limit, RLIMIT_FSIZE: written up to it, then EFBIG) is not acknowledged: its
// record fails with ErrUnknownOutcome and ErrFailStop, later appends fail, and a reopen
// (without the limit) finds the records before it and a torn tail, not corruption. In a
// child process.
func TestKeptWriteCutShort(t *testing.T) {
	if dir := os.Getenv(pwritevLimitEnv); dir != "" {
		keptWriteCutShortChild(t, dir)
		return
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestKeptWriteCutShort$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), pwritevLimitEnv+"="+dir)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "child:\n%s", out)
	require.Contains(t, string(out), "--- PASS: TestKeptWriteCutShort", "child:\n%s", out)

	var got []Record
	w, err := Open(vfs.Default, dir, Options{}, func(r Record) error {
		got = append(got, Record{LSN: r.LSN, Kind: r.Kind, Payload: append([]byte(nil), r.Payload...)})
		return nil
	})
	require.NoError(t, err)
	defer w.Close()
	require.Len(t, got, 1)
	require.Equal(t, uint64(1), got[0].LSN)
	require.Equal(t, bytes.Repeat([]byte{1}, 4096), got[0].Payload)
}

func keptWriteCutShortChild(t *testing.T, dir string) {
	w, err := Open(vfs.Default, dir, Options{Sync: SyncAlways}, nil)
	require.NoError(t, err)
	ch := make(chan error, 1)
	done := func(_ uint64, err error) { ch <- err }
	small := bytes.Repeat([]byte{1}, 4096)
	require.NoError(t, w.AppendPiecesAsync(7, []Piece{{Bytes: small[:8]}, {Bytes: small[8:], Keep: true}}, false, done))
	require.NoError(t, <-ch)
	st, err := os.Stat(dir + "/" + segmentName(1))
	require.NoError(t, err)
	// The limit falls inside the next record's kept piece.
	limit := uint64(st.Size()) + 2000
	require.NoError(t, syscall.Setrlimit(syscall.RLIMIT_FSIZE, &syscall.Rlimit{Cur: limit, Max: limit}))
	big := bytes.Repeat([]byte{2}, 1<<16)
	require.NoError(t, w.AppendPiecesAsync(7, []Piece{{Bytes: big[:8]}, {Bytes: big[8:], Keep: true}}, false, done))
	err = <-ch
	require.ErrorIs(t, err, ErrUnknownOutcome)
	require.ErrorIs(t, err, ErrFailStop)
	require.True(t, errors.Is(err, syscall.EFBIG), "%v", err)
	err = w.AppendPiecesAsync(7, []Piece{{Bytes: small}}, false, done)
	require.ErrorIs(t, err, ErrFailStop)
	w.Close()
}
