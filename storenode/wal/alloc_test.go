//go:build !race

package wal

import (
	"context"
	"io"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/internal/vfs"
)

// discardFS is a file system whose files accept and drop every write, so an allocation
// count sees the WAL's own allocations only.
type discardFS struct{ vfs.FS }

type discardFile struct{ size int64 }

func (discardFS) Create(string) (vfs.File, error)        { return &discardFile{}, nil }
func (discardFS) List(string) ([]string, error)          { return nil, nil }
func (discardFS) MkdirAll(string) error                  { return nil }
func (discardFS) SyncDir(string) error                   { return nil }
func (discardFS) Lock(string) (io.Closer, error)         { return io.NopCloser(nil), nil }
func (f *discardFile) ReadAt([]byte, int64) (int, error) { return 0, io.EOF }
func (f *discardFile) WriteAt(p []byte, off int64) (int, error) {
	f.size = max(f.size, off+int64(len(p)))
	return len(p), nil
}
func (f *discardFile) Write(p []byte) (int, error) { return f.WriteAt(p, f.size) }
func (f *discardFile) Close() error                { return nil }
func (f *discardFile) Sync() error                 { return nil }
func (f *discardFile) Size() (int64, error)        { return f.size, nil }
func (f *discardFile) Truncate(size int64) error   { f.size = size; return nil }
func (f *discardFile) Allocate(int64, int64) error { return nil }

// TestAppendAllocs guards the append path: no allocation per record, in either sync mode.
func TestAppendAllocs(t *testing.T) {
	for _, mode := range []SyncMode{SyncAlways, SyncNone} {
		w, err := Open(discardFS{}, "d", Options{Sync: mode}, nil)
		require.NoError(t, err)
		payload := [][]byte{make([]byte, 64), make([]byte, 40)}
		ctx := context.Background()
		allocs := testing.AllocsPerRun(1000, func() {
			_, err := w.Append(ctx, 1, payload, false)
			require.NoError(t, err)
		})
		require.Zero(t, allocs, "sync=%s", mode)
		require.NoError(t, w.Close())
	}
}

// TestAppendPiecesAllocs guards the gather path: kept pieces cost no allocation per record,
// on the OS file system's pwritev too.
func TestAppendPiecesAllocs(t *testing.T) {
	if invariants {
		t.Skip("the invariants check assembles each record with kept pieces to decode it")
	}
	for _, osFS := range []bool{false, true} {
		var fsys vfs.FS = discardFS{}
		dir := "d"
		if osFS {
			fsys, dir = vfs.Default, t.TempDir()
		}
		w, err := Open(fsys, dir, Options{Sync: SyncNone}, nil)
		require.NoError(t, err)
		pieces := []Piece{{Bytes: make([]byte, 8)}, {Bytes: make([]byte, 4000), Keep: true}, {Bytes: make([]byte, 5)}}
		ch := make(chan error, 1)
		done := func(_ uint64, err error) { ch <- err }
		appendOne := func() {
			require.NoError(t, w.AppendPiecesAsync(1, pieces, false, done))
			require.NoError(t, <-ch)
		}
		for range 100 {
			appendOne()
		}
		require.Zero(t, testing.AllocsPerRun(1000, appendOne), "os=%v", osFS)
		require.NoError(t, w.Close())
	}
}
