package wal

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/internal/vfs"
)

const testDir = "db/wal"

// testTimeout bounds every wait of a test.
const testTimeout = 30 * time.Second

// rec is a copied record, for comparisons.
type rec struct {
	LSN     uint64
	Kind    byte
	Payload []byte
}

// payloadOf returns a deterministic payload for a test record, of a length that varies with
// n (0 to 200 bytes), so records cross sectors and padding.
func payloadOf(n uint64) []byte {
	var b bytes.Buffer
	size := int(n*37) % 201
	for b.Len() < size {
		fmt.Fprintf(&b, "<%d>", n)
	}
	return append([]byte{}, b.Bytes()[:size]...)
}

// openCollect opens the WAL and returns it with the records replayed (copied).
func openCollect(t testing.TB, fsys vfs.FS, opts Options) (*WAL, []rec, error) {
	t.Helper()
	var got []rec
	w, err := Open(fsys, testDir, opts, func(r Record) error {
		got = append(got, rec{r.LSN, r.Kind, append([]byte{}, r.Payload...)})
		return nil
	})
	return w, got, err
}

// mustOpen opens the WAL, failing the test on error, and closes it at the end of the test.
func mustOpen(t testing.TB, fsys vfs.FS, opts Options) (*WAL, []rec) {
	t.Helper()
	w, got, err := openCollect(t, fsys, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = w.Close() })
	return w, got
}

// appendN appends records from..to with payloadOf and kind lsn%7, checking their LSNs.
func appendN(t testing.TB, w *WAL, from, to uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	for n := from; n <= to; n++ {
		p := payloadOf(n)
		lsn, err := w.Append(ctx, byte(n%7), [][]byte{p[:len(p)/2], p[len(p)/2:]}, false)
		require.NoError(t, err)
		require.Equal(t, n, lsn)
	}
}

// requireRecords checks that got holds exactly the records from..to of appendN.
func requireRecords(t testing.TB, got []rec, from, to uint64) {
	t.Helper()
	require.Len(t, got, int(to+1-from))
	for i, r := range got {
		n := from + uint64(i)
		require.Equal(t, rec{n, byte(n % 7), payloadOf(n)}, rec{r.LSN, r.Kind, r.Payload}, "record %d", i)
	}
}

// segments lists the segment files of testDir.
func segments(t testing.TB, fsys vfs.FS) []string {
	t.Helper()
	names, err := fsys.List(testDir)
	require.NoError(t, err)
	var segs []string
	for _, n := range names {
		if _, ok := parseSegmentName(n); ok {
			segs = append(segs, n)
		}
	}
	return segs
}
