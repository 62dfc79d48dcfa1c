//go:build unix

package storenode

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/internal/corrupt"
	"github.com/weftdb/weft/internal/vfs"
)

// TestCheckOddFilesDoNotHang: a FIFO where a store file belongs (a data file, the meta file,
// a WAL segment, a lock file) blocked Check forever in open(2) (read-only, no writer), where
// Ctrl-C cannot reach it. Check must refuse it at once as not a regular file.
func TestCheckOddFilesDoNotHang(t *testing.T) {
	s := buildCheckStores(t)
	for _, name := range []string{"table-00000001.dat", metaName, "wal/LOCK", "LOCK"} {
		dir := copyStore(t, s.clean)
		p := filepath.Join(dir, name)
		require.NoError(t, os.Remove(p))
		require.NoError(t, syscall.Mkfifo(p, 0o644))
		done := make(chan error, 1)
		go func() {
			_, err := Check(context.Background(), dir, CheckOptions{})
			done <- err
		}()
		select {
		case err := <-done:
			require.Error(t, err, name)
			require.ErrorIs(t, err, vfs.ErrNotRegular, name)
		case <-time.After(30 * time.Second): // a bound on the test, not a synchronisation
			// Unblock the open so the goroutine ends: a writer on the FIFO.
			if f, err := os.OpenFile(p, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
				f.Close()
			}
			t.Fatalf("%s: Check still blocked on a FIFO after 30 s", name)
		}
	}
}

// TestCheckHugeSparseMeta: a meta file of 64 GiB (sparse: a truncate, no data) was read
// whole into memory before its checksum was looked at; the allocation failed and the runtime
// killed the process (exit 2, which weft verify means as "bad usage"), or, where memory is
// overcommitted, it read 64 GiB into RAM. Check runs in a child process here, so the parent
// sees a crash; it must report the damage.
func TestCheckHugeSparseMeta(t *testing.T) {
	if dir := os.Getenv("WEFT_CHECK_SPARSE_DIR"); dir != "" {
		rep := requireChecked(t, context.Background(), dir, CheckOptions{})
		for _, f := range rep.Findings {
			t.Log(f.String())
		}
		require.True(t, rep.Damaged())
		return
	}
	s := buildCheckStores(t)
	dir := copyStore(t, s.clean)
	meta := filepath.Join(dir, metaName)
	require.NoError(t, os.WriteFile(meta, nil, 0o644))
	require.NoError(t, os.Truncate(meta, 64<<30))
	cmd := exec.Command(os.Args[0], "-test.run=^TestCheckHugeSparseMeta$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "WEFT_CHECK_SPARSE_DIR="+dir)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "damage: meta")

	// Open refuses it the same way.
	_, err = Open(checkTestOptions(dir))
	require.ErrorIs(t, err, corrupt.ErrCorruption)

	// A good header, then a hole: the streamed checksum finds it.
	good, err := os.ReadFile(filepath.Join(s.clean, metaName))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(meta, good, 0o644))
	require.NoError(t, os.Truncate(meta, 256<<20))
	rep := runCheck(t, dir)
	requireOnly(t, rep, Finding{Damage: true, File: metaName, Offset: -1, Page: -1, DiskPage: -1},
		fmt.Sprintf("offset %d: checksum", 256<<20-metaTrailerBytes))

	// The streamed check passes a good meta file.
	ffs := vfs.NewFaultFS()
	require.NoError(t, ffs.WriteFile("meta", good))
	mf, err := ffs.Open("meta")
	require.NoError(t, err)
	defer mf.Close()
	require.NoError(t, precheckMeta(mf, int64(len(good))))
}

// TestHugeSparseMapLog: a meta file naming a map log of 1 TiB published bytes, the log one
// hole (a crafted or damaged backup restores exactly that: the meta file's checksum is no
// proof of the log's length), was read whole into memory before any record was looked at:
// the allocation failed and the runtime killed the process. Check runs in a child process
// here, so the parent sees a crash; it must report the damage, and Open must refuse it.
func TestHugeSparseMapLog(t *testing.T) {
	if dir := os.Getenv("WEFT_CHECK_SPARSE_LOG_DIR"); dir != "" {
		rep := requireChecked(t, context.Background(), dir, CheckOptions{})
		for _, f := range rep.Findings {
			t.Log(f.String())
		}
		require.True(t, rep.Damaged())
		return
	}
	clean, _ := mapLogStore(t)
	dir := copyStore(t, clean)
	m := loadTestMeta(t, dir)
	name := mapLogName(m.logGen)
	good := m.logLen
	m.logLen = 1 << 40
	writeTestFile(t, filepath.Join(dir, metaName), encodeMeta(m))
	require.NoError(t, os.Truncate(filepath.Join(dir, name), 1<<40))
	cmd := exec.Command(os.Args[0], "-test.run=^TestHugeSparseMapLog$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "WEFT_CHECK_SPARSE_LOG_DIR="+dir)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), fmt.Sprintf("damage: %s offset %d: ", name, good))

	_, err = Open(checkTestOptions(dir))
	require.ErrorIs(t, err, corrupt.ErrCorruption)
}
