package hashindex_test

import (
	"context"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/hashindex"
	"github.com/weftdb/weft/internal/corrupt"
	"github.com/weftdb/weft/txnode"
)

func openDB(t *testing.T, dir string) *txnode.DB {
	t.Helper()
	db, err := txnode.Open(context.Background(), txnode.Options{Dir: dir, SyncMode: "none"})
	require.NoError(t, err)
	return db
}

func key8(i int) []byte { return binary.LittleEndian.AppendUint64(nil, uint64(i)*0x1000193) }

func TestUniqueGrowDeleteReopen(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	db := openDB(t, dir)
	defer func() { db.Close(ctx) }()
	ix, err := hashindex.Create(ctx, db, "names", hashindex.Options{KeyBytes: 8, Unique: true, RowBytes: 64})
	require.NoError(t, err)
	n := 3000
	if testing.Short() {
		n = 800
	}
	for i := range n {
		require.NoError(t, ix.Insert(ctx, key8(i), uint64(i)+100))
	}
	st, err := ix.Verify(ctx)
	require.NoError(t, err)
	require.Equal(t, n, st.Entries)
	require.Greater(t, st.Buckets, n/4, "%+v", st)
	for i := range n {
		id, err := ix.Lookup(ctx, key8(i))
		require.NoError(t, err)
		require.Equal(t, uint64(i)+100, id)
	}
	require.ErrorIs(t, ix.Insert(ctx, key8(7), 1), hashindex.ErrUniqueViolation)
	_, err = ix.Lookup(ctx, key8(n+1))
	require.ErrorIs(t, err, hashindex.ErrNotFound)
	for i := 0; i < n; i += 2 {
		require.NoError(t, ix.Delete(ctx, key8(i), uint64(i)+100))
	}
	require.ErrorIs(t, ix.Delete(ctx, key8(0), 100), hashindex.ErrNotFound)
	require.ErrorIs(t, ix.Delete(ctx, key8(1), 5), hashindex.ErrNotFound)
	st, err = ix.Verify(ctx)
	require.NoError(t, err)
	require.Equal(t, n/2, st.Entries)

	require.NoError(t, db.Close(ctx))
	db = openDB(t, dir)
	ix, err = hashindex.Open(ctx, db, "names")
	require.NoError(t, err)
	for i := range n {
		id, err := ix.Lookup(ctx, key8(i))
		if i%2 == 0 {
			require.ErrorIs(t, err, hashindex.ErrNotFound)
			continue
		}
		require.NoError(t, err)
		require.Equal(t, uint64(i)+100, id)
	}
	_, err = ix.Verify(ctx)
	require.NoError(t, err)
	_ = errors.Is
	_ = corrupt.ErrCorruption
}
