package wal

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/internal/vfs"
)

// piecesOf splits payloadOf(n) into pieces, keeping some by reference: a kept piece first,
// last, between copies, and records with none, so gather lists mix both.
func piecesOf(n uint64) []Piece {
	p := payloadOf(n)
	a, b := len(p)/3, 2*len(p)/3
	switch n % 4 {
	case 0:
		return []Piece{{Bytes: p}}
	case 1:
		return []Piece{{Bytes: p[:a], Keep: true}, {Bytes: p[a:]}}
	case 2:
		return []Piece{{Bytes: p[:a]}, {Bytes: p[a:b], Keep: true}, {Bytes: p[b:]}}
	default:
		return []Piece{{Bytes: p[:a]}, {Bytes: p[a:b], Keep: true}, {Bytes: p[b:], Keep: true}}
	}
}

// appendPiecesN appends records from..to with piecesOf from concurrent goroutines, so groups
// hold several records with kept pieces, and waits for them.
func appendPiecesN(t *testing.T, w *WAL, from, to uint64) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, to+1-from)
	var mu sync.Mutex // appends in LSN order of n: one at a time, callbacks concurrent
	for n := from; n <= to; n++ {
		wg.Add(1)
		mu.Lock()
		err := w.AppendPiecesAsync(byte(n%7), piecesOf(n), false, func(lsn uint64, err error) {
			if err == nil && lsn != n {
				err = context.DeadlineExceeded // any non-nil: the wrong LSN
			}
			errs <- err
			wg.Done()
		})
		mu.Unlock()
		require.NoError(t, err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

// TestAppendPieces writes records whose kept pieces are gathered into the write (pwritev on
// the OS file system, WriteAt per piece on the fault file system) and reads them back.
func TestAppendPieces(t *testing.T) {
	for _, osFS := range []bool{true, false} {
		fsys := vfs.FS(vfs.NewFaultFS())
		dir := testDir
		if osFS {
			fsys, dir = vfs.Default, t.TempDir()
		}
		for _, mode := range []SyncMode{SyncNone, SyncAlways} {
			opts := Options{Sync: mode, SegmentBytes: 8192}
			sub := dir + "/" + mode.String()
			w, err := Open(fsys, sub, opts, nil)
			require.NoError(t, err)
			appendPiecesN(t, w, 1, 300)
			appendN(t, w, 301, 320) // copied records after kept ones
			require.NoError(t, w.Close())
			var got []rec
			w, err = Open(fsys, sub, opts, func(r Record) error {
				got = append(got, rec{r.LSN, r.Kind, append([]byte{}, r.Payload...)})
				return nil
			})
			require.NoError(t, err)
			requireRecords(t, got, 1, 320)
			require.NoError(t, w.Close())
		}
	}
}

// TestAppendPiecesQueueBound counts kept bytes against MaxQueueBytes: a kept piece is memory
// the queue holds, though it is not copied.
func TestAppendPiecesQueueBound(t *testing.T) {
	fs := vfs.NewFaultFS()
	w, _ := mustOpen(t, fs, Options{MaxQueueBytes: 1024})
	entered, release := blockSyncs(fs)
	defer release()
	results := make(chan error, 100)
	done := func(lsn uint64, err error) { results <- err }
	require.NoError(t, w.AppendAsync(1, [][]byte{make([]byte, 100)}, false, done))
	<-entered // the writer holds record 1 in its sync; the queue is empty
	kept := []Piece{{Bytes: make([]byte, 8)}, {Bytes: make([]byte, 92), Keep: true}}
	queued := 0
	for {
		err := w.AppendPiecesAsync(1, kept, false, done)
		if errors.Is(err, ErrBusy) {
			break
		}
		require.NoError(t, err)
		queued++
	}
	require.Equal(t, 1024/recordSize(100), queued)
	release()
	for range queued + 1 {
		require.NoError(t, <-results)
	}
	require.NoError(t, w.Close())
}
