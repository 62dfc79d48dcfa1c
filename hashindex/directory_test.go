package hashindex_test

import (
	"context"
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/weftdb/weft/internal/checksum"
	"github.com/weftdb/weft/internal/corrupt"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/hashindex"
	"github.com/weftdb/weft/txnode"
)

// TestTxDirectoryRefreshHonoursTxContext: a transaction whose lookup must refresh a stale
// directory snapshot (another Index handle grew the index) waits for the refresh under the
// transaction's context, so a cancelled transaction returns instead of waiting for ever.
func TestTxDirectoryRefreshHonoursTxContext(t *testing.T) {
	ctx := context.Background()
	db := openDB(t, t.TempDir())
	defer func() { db.Close(ctx) }()
	grower := createIndex(t, ctx, db, "names", hashindex.Options{KeyBytes: 8, Unique: true, RowBytes: 64})
	stale, err := hashindex.Open(ctx, db, "names") // one bucket in its snapshot
	require.NoError(t, err)
	n := 400
	for i := range n {
		require.NoError(t, grower.Insert(ctx, key8(i), uint64(i)+1))
	}
	release := stale.HoldDirForTest() // a refresh in progress, stuck
	released := false
	defer func() {
		if !released {
			release()
		}
	}()
	// Every key not in bucket 0 makes the stale handle refresh; most keys are not in it.
	for i := range 16 {
		tctx, cancel := context.WithCancel(ctx)
		tx, err := db.Begin(tctx, false)
		require.NoError(t, err)
		cancel()
		done := make(chan error, 1)
		go func() {
			_, err := stale.TxLookup(tx, key8(i))
			done <- err
		}()
		select {
		case err := <-done:
			tx.Rollback()
			if err == nil {
				continue // bucket 0: no refresh needed
			}
			require.ErrorIs(t, err, context.Canceled)
			return
		case <-time.After(10 * time.Second):
			release()
			released = true
			err := <-done
			tx.Rollback()
			t.Fatalf("TxLookup of a cancelled transaction waited for the refresh lock (then returned %v)", err)
		}
	}
	t.Fatal(errors.New("no key needed a refresh"))
}

// TestVerifyHugeBucketCount: a header whose checksum holds but whose bucket count is absurd
// (a crafted or foreign row) is reported by Verify as corruption, never sized into an
// allocation first.
func TestVerifyHugeBucketCount(t *testing.T) {
	ctx := context.Background()
	db := openDB(t, t.TempDir())
	defer func() { db.Close(ctx) }()
	ix := createIndex(t, ctx, db, "a", hashindex.Options{KeyBytes: 8, Unique: true})
	row := make([]byte, ix.Table().RowBytes())
	var hdrID uint64
	for r, err := range ix.Table().ScanAll(ctx) {
		require.NoError(t, err)
		hdrID = r.ID
		break
	}
	require.NoError(t, ix.Table().Get(ctx, hdrID, row))
	dirCap := uint64(len(row)-24) / 8
	n := uint64(1) << 50
	binary.LittleEndian.PutUint64(row[24:], n)
	binary.LittleEndian.PutUint64(row[48:], (n+dirCap-1)/dirCap)
	binary.LittleEndian.PutUint64(row[40:], binary.LittleEndian.Uint64(row[32:])+1) // tail != head
	binary.LittleEndian.PutUint32(row[0:], checksum.Of(row[4:64]))
	require.NoError(t, ix.Table().Put(ctx, hdrID, row))
	_, err := ix.Verify(ctx)
	require.ErrorIs(t, err, corrupt.ErrCorruption)
}

// TestDirectoryAheadOfTableRecovers: a directory snapshot that holds a bucket the table no
// longer has (its split was committed in WriteBack, then its epoch lost) is not reported
// as corruption: the index reads its directory afresh and answers from the committed rows.
func TestDirectoryAheadOfTableRecovers(t *testing.T) {
	ctx := context.Background()
	db := openDB(t, t.TempDir())
	defer func() { db.Close(ctx) }()
	ix := createIndex(t, ctx, db, "names", hashindex.Options{KeyBytes: 8, Unique: true, RowBytes: 64})
	n := 300
	for i := range n {
		require.NoError(t, ix.Insert(ctx, key8(i), uint64(i)+1))
	}
	ix.LoseSplitForTest(1 << 40)
	for i := range n {
		id, err := ix.Lookup(ctx, key8(i))
		require.NoError(t, err, "key %d", i)
		require.Equal(t, uint64(i)+1, id)
	}
	ix.LoseSplitForTest(1 << 40)
	require.NoError(t, db.View(ctx, func(tx *txnode.Tx) error {
		for i := range n {
			id, err := ix.TxLookup(tx, key8(i))
			if err != nil {
				return err
			}
			require.Equal(t, uint64(i)+1, id)
		}
		return nil
	}))
	ix.LoseSplitForTest(1 << 40)
	for i := n; i < 2*n; i++ {
		require.NoError(t, ix.Insert(ctx, key8(i), uint64(i)+1))
	}
	st := verifyIndex(t, ctx, ix)
	require.Equal(t, 2*n, st.Entries)
}

// TestFastPathCatchesFlippedBit: Lookup's fast path, which skips the checksum of a primary
// row it verified before, still reports a row whose entries changed under it (a bit of an
// id flipped, the checksum field kept) as corruption, never returns the damaged id.
func TestFastPathCatchesFlippedBit(t *testing.T) {
	ctx := context.Background()
	db := openDB(t, t.TempDir())
	defer func() { db.Close(ctx) }()
	ix := createIndex(t, ctx, db, "a", hashindex.Options{KeyBytes: 8, Unique: true})
	n := 40
	for i := range n {
		require.NoError(t, ix.Insert(ctx, key8(i), uint64(i)+1))
	}
	for i := range n { // verified, then fast
		id, err := ix.Lookup(ctx, key8(i))
		require.NoError(t, err)
		require.Equal(t, uint64(i)+1, id)
	}
	row := make([]byte, ix.Table().RowBytes())
	flipped := 0
	for _, bid := range rowsOfKind(t, ix.Table(), 1) {
		require.NoError(t, ix.Table().Get(ctx, bid, row))
		if binary.LittleEndian.Uint16(row[6:]) == 0 {
			continue
		}
		row[24+8+1] ^= 0x10 // the first entry's id (8-byte keys)
		require.NoError(t, ix.Table().Put(ctx, bid, row))
		flipped++
	}
	require.NotZero(t, flipped)
	damaged := 0
	for i := range n {
		id, err := ix.Lookup(ctx, key8(i))
		if err != nil {
			require.ErrorIs(t, err, corrupt.ErrCorruption)
			damaged++
			continue
		}
		require.Equal(t, uint64(i)+1, id, "key %d: a damaged id returned as data", i)
	}
	require.NotZero(t, damaged)
}

// TestUseAfterClose: every operation of an index whose DB is closed fails with
// txnode.ErrClosed, not a panic or a claim of corruption.
func TestUseAfterClose(t *testing.T) {
	ctx := context.Background()
	db := openDB(t, t.TempDir())
	ix := createIndex(t, ctx, db, "a", hashindex.Options{KeyBytes: 8})
	for i := range 100 {
		require.NoError(t, ix.Insert(ctx, key8(i%7), uint64(i)+1))
	}
	require.NoError(t, db.Close(ctx))
	for i := range 7 {
		_, err := ix.Lookup(ctx, key8(i))
		require.ErrorIs(t, err, txnode.ErrClosed)
		require.ErrorIs(t, ix.Insert(ctx, key8(i), 1000), txnode.ErrClosed)
		require.ErrorIs(t, ix.Delete(ctx, key8(i), 1), txnode.ErrClosed)
		for _, err := range ix.IDs(ctx, key8(i)) {
			require.ErrorIs(t, err, txnode.ErrClosed)
		}
	}
	_, err := ix.Verify(ctx)
	require.ErrorIs(t, err, txnode.ErrClosed)
	_, err = ix.Lookup(ctx, nil)
	require.ErrorIs(t, err, hashindex.ErrKeySize)
}
