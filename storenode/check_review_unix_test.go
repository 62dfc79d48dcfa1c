//go:build unix

package storenode

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

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
