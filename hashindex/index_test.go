package hashindex_test

import (
	"context"
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/hashindex"
	"github.com/weftdb/weft/internal/corrupt"
	"github.com/weftdb/weft/storenode"
	"github.com/weftdb/weft/txnode"
)

func openDB(t *testing.T, dir string) *txnode.DB {
	t.Helper()
	db, err := txnode.Open(context.Background(), txnode.Options{Dir: dir, SyncMode: "none"})
	require.NoError(t, err)
	return db
}

// createIndex creates the index name over db, failing the test on error.
func createIndex(t *testing.T, ctx context.Context, db *txnode.DB, name string, opts hashindex.Options) *hashindex.Index {
	t.Helper()
	ix, err := hashindex.Create(ctx, db, name, opts)
	require.NoError(t, err)
	return ix
}

// verifyIndex verifies ix (Index.Verify), failing the test on an error, and returns its stats.
func verifyIndex(t *testing.T, ctx context.Context, ix *hashindex.Index) hashindex.Stats {
	t.Helper()
	st, err := ix.Verify(ctx)
	require.NoError(t, err)
	return st
}

func key8(i int) []byte { return binary.LittleEndian.AppendUint64(nil, uint64(i)*0x1000193) }

func TestUniqueGrowDeleteReopen(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	db := openDB(t, dir)
	defer func() { db.Close(ctx) }()
	ix := createIndex(t, ctx, db, "names", hashindex.Options{KeyBytes: 8, Unique: true, RowBytes: 64})
	n := 3000
	if testing.Short() {
		n = 800
	}
	for i := range n {
		require.NoError(t, ix.Insert(ctx, key8(i), uint64(i)+100))
	}
	st := verifyIndex(t, ctx, ix)
	require.Equal(t, n, st.Entries)
	require.Greater(t, st.Buckets, n/4, "%+v", st)
	for i := range n {
		id, err := ix.Lookup(ctx, key8(i))
		require.NoError(t, err)
		require.Equal(t, uint64(i)+100, id)
	}
	require.ErrorIs(t, ix.Insert(ctx, key8(7), 1), hashindex.ErrUniqueViolation)
	_, err := ix.Lookup(ctx, key8(n+1))
	require.ErrorIs(t, err, hashindex.ErrNotFound)
	for i := 0; i < n; i += 2 {
		require.NoError(t, ix.Delete(ctx, key8(i), uint64(i)+100))
	}
	require.ErrorIs(t, ix.Delete(ctx, key8(0), 100), hashindex.ErrNotFound)
	require.ErrorIs(t, ix.Delete(ctx, key8(1), 5), hashindex.ErrNotFound)
	st = verifyIndex(t, ctx, ix)
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
	verifyIndex(t, ctx, ix)
}

// rowsOfKind returns the ids of the index table's rows of a kind (the byte at offset 4 of
// the format: 1 bucket, 2 overflow, 3 directory).
func rowsOfKind(t *testing.T, table *txnode.Table, kind byte) []uint64 {
	t.Helper()
	var ids []uint64
	first := true
	for r, err := range table.ScanAll(context.Background()) {
		require.NoError(t, err)
		if !first && r.Data[4] == kind {
			ids = append(ids, r.ID)
		}
		first = false
	}
	return ids
}

// TestCorruptionReported: a foreign table, an empty one, a damaged header or bucket row and
// another index's row are reported as corruption, never read as data.
func TestCorruptionReported(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	db := openDB(t, dir)
	defer func() { db.Close(ctx) }()

	// Not an index: a table of game rows, and an empty table.
	items, err := db.CreateTable(ctx, "items", 64)
	require.NoError(t, err)
	_, err = items.Insert(ctx, make([]byte, 64))
	require.NoError(t, err)
	_, err = hashindex.Open(ctx, db, "items")
	require.ErrorIs(t, err, corrupt.ErrCorruption)
	_, err = db.CreateTable(ctx, "empty", 64)
	require.NoError(t, err)
	_, err = hashindex.Open(ctx, db, "empty")
	require.ErrorIs(t, err, corrupt.ErrCorruption)
	_, err = hashindex.Open(ctx, db, "missing")
	require.ErrorIs(t, err, txnode.ErrTableNotFound)

	a := createIndex(t, ctx, db, "a", hashindex.Options{KeyBytes: 8, Unique: true})
	b := createIndex(t, ctx, db, "b", hashindex.Options{KeyBytes: 8, Unique: true})
	for i := range 50 {
		require.NoError(t, a.Insert(ctx, key8(i), uint64(i)))
		require.NoError(t, b.Insert(ctx, key8(i), uint64(i)))
	}
	row := make([]byte, a.Table().RowBytes())

	// Another index's bucket row in place of one of a's: the salted checksum catches it.
	aBuckets, bBuckets := rowsOfKind(t, a.Table(), 1), rowsOfKind(t, b.Table(), 1)
	require.NotEmpty(t, bBuckets)
	saved := make([][]byte, len(aBuckets))
	for i, id := range aBuckets {
		saved[i] = make([]byte, len(row))
		require.NoError(t, a.Table().Get(ctx, id, saved[i]))
		require.NoError(t, b.Table().Get(ctx, bBuckets[i%len(bBuckets)], row))
		require.NoError(t, a.Table().Put(ctx, id, row))
	}
	for i := range 50 {
		_, err := a.Lookup(ctx, key8(i))
		require.ErrorIs(t, err, corrupt.ErrCorruption)
		require.ErrorIs(t, a.Insert(ctx, key8(1000+i), 1), corrupt.ErrCorruption)
	}
	_, err = a.Verify(ctx)
	require.ErrorIs(t, err, corrupt.ErrCorruption)
	for i, id := range aBuckets {
		require.NoError(t, a.Table().Put(ctx, id, saved[i]))
	}
	verifyIndex(t, ctx, a)

	// A flipped bit in a bucket row, in its header (bucket number), which every read sums.
	// (Byte 30 was the first entry's: the test failed whenever the salt left aBuckets[0]
	// empty, since bytes past a row's entries are never read, so not summed.)
	id := aBuckets[0]
	require.NoError(t, a.Table().Get(ctx, id, row))
	row[10] ^= 1
	require.NoError(t, a.Table().Put(ctx, id, row))
	_, err = a.Verify(ctx)
	require.ErrorIs(t, err, corrupt.ErrCorruption)
	require.NoError(t, a.Table().Put(ctx, id, saved[0]))

	// A flipped bit in the header: Open of the reopened DB fails.
	var hdrID uint64
	for r, err := range b.Table().ScanAll(ctx) {
		require.NoError(t, err)
		hdrID = r.ID
		break
	}
	require.NoError(t, b.Table().Get(ctx, hdrID, row))
	row[25] ^= 0x40
	require.NoError(t, b.Table().Put(ctx, hdrID, row))
	_, err = b.Verify(ctx)
	require.ErrorIs(t, err, corrupt.ErrCorruption)
	require.NoError(t, db.Close(ctx))
	db = openDB(t, dir)
	_, err = hashindex.Open(ctx, db, "b")
	require.ErrorIs(t, err, corrupt.ErrCorruption)
	a, err = hashindex.Open(ctx, db, "a")
	require.NoError(t, err)
	verifyIndex(t, ctx, a)
}

func TestOptionsAndKeySize(t *testing.T) {
	ctx := context.Background()
	db := openDB(t, t.TempDir())
	defer db.Close(ctx)
	for _, o := range []hashindex.Options{
		{KeyBytes: 0}, {KeyBytes: 300}, {KeyBytes: 8, RowBytes: 60}, {KeyBytes: 8, RowBytes: 72 + 4},
		{KeyBytes: 256, RowBytes: 256}, {KeyBytes: 8, Buckets: -1}, {KeyBytes: 8, RowBytes: 8192}, {KeyBytes: 8, Buckets: 1 << 16},
	} {
		_, err := hashindex.Create(ctx, db, "x", o)
		require.ErrorIs(t, err, hashindex.ErrOptions, "%+v", o)
	}
	require.Equal(t, 256, hashindex.DefaultRowBytes(16)) // 24 + 8*24 = 216, rounded to 256
	require.Equal(t, 128, hashindex.DefaultRowBytes(4))
	require.Equal(t, 2176, hashindex.DefaultRowBytes(256))
	ix := createIndex(t, ctx, db, "x", hashindex.Options{KeyBytes: 16, Buckets: 100})
	st := verifyIndex(t, ctx, ix)
	require.Equal(t, 128, st.Buckets)
	require.Equal(t, 9, st.EntriesPerRow) // (256-24)/24
	_, err := hashindex.Create(ctx, db, "x", hashindex.Options{KeyBytes: 16})
	require.ErrorIs(t, err, storenode.ErrTableExists)
	k, err := ix.Key("alice")
	require.NoError(t, err)
	require.Equal(t, append([]byte("alice"), make([]byte, 11)...), k)
	_, err = ix.Key("a name of seventeen")
	require.ErrorIs(t, err, hashindex.ErrKeySize)
	_, err = ix.Lookup(ctx, []byte("short"))
	require.ErrorIs(t, err, hashindex.ErrKeySize)
	require.ErrorIs(t, ix.Insert(ctx, make([]byte, 17), 1), hashindex.ErrKeySize)
	require.ErrorIs(t, ix.Delete(ctx, nil, 1), hashindex.ErrKeySize)
	for _, err := range ix.IDs(ctx, nil) {
		require.ErrorIs(t, err, hashindex.ErrKeySize)
	}
}
