package hashindex

import (
	"context"
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/internal/corrupt"
	"github.com/weftdb/weft/txnode"
)

// TestChainLoopReported: an overflow chain damaged into a loop (with valid checksums, as a
// buggy writer would leave it) is reported as corruption, not walked for ever.
func TestChainLoopReported(t *testing.T) {
	ctx := context.Background()
	db := openTestDB(t)
	// One bucket that never splits: a non-unique index of one key.
	ix, err := Create(ctx, db, "ix", Options{KeyBytes: 8, RowBytes: 64})
	require.NoError(t, err)
	key := binary.LittleEndian.AppendUint64(nil, 42)
	for id := range 20 {
		require.NoError(t, ix.Insert(ctx, key, uint64(id)))
	}
	st, err := ix.Verify(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, st.Buckets)
	require.Equal(t, 9, st.OverflowRows) // 2 entries a row

	// Point the last overflow row of the chain back at an earlier one.
	row := make([]byte, 64)
	var chain []uint64
	for r, err := range ix.Table().ScanAll(ctx) {
		require.NoError(t, err)
		if r.Data[4] == kindOverflow {
			chain = append(chain, r.ID)
		}
	}
	require.Len(t, chain, 9)
	for _, target := range []uint64{chain[0], chain[8]} { // the chain's last row, and its first
		require.NoError(t, ix.Table().Get(ctx, chain[0], row))
		v, err := ix.fmt.decodeRow(row)
		require.NoError(t, err)
		require.Equal(t, uint64(noRow), v.next)
		v.next = target
		ix.fmt.encodeRow(row, &v)
		require.NoError(t, ix.Table().Put(ctx, chain[0], row))
		_, err = ix.Lookup(ctx, binary.LittleEndian.AppendUint64(nil, 7)) // absent: walks it all
		require.ErrorIs(t, err, corrupt.ErrCorruption)
		require.ErrorIs(t, ix.Insert(ctx, key, 99), corrupt.ErrCorruption)
		_, err = ix.Verify(ctx)
		require.ErrorIs(t, err, corrupt.ErrCorruption)
		v.next = noRow
		ix.fmt.encodeRow(row, &v)
		require.NoError(t, ix.Table().Put(ctx, chain[0], row))
	}
	_, err = ix.Verify(ctx)
	require.NoError(t, err)
}

// openTestDB opens an embedded store (no fsync) in a fresh directory, closed at the test's
// end: the internal tests' openDB.
func openTestDB(t *testing.T) *txnode.DB {
	t.Helper()
	ctx := context.Background()
	db, err := txnode.Open(ctx, txnode.Options{Dir: t.TempDir(), SyncMode: "none"})
	require.NoError(t, err)
	t.Cleanup(func() { db.Close(ctx) })
	return db
}
