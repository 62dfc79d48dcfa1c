package hashindex_test

import (
	"context"
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/hashindex"
	"github.com/weftdb/weft/internal/testkit/faultstore"
	"github.com/weftdb/weft/storenode"
	"github.com/weftdb/weft/txnode"
	"github.com/weftdb/weft/txnode/store"
)

// TestFastPathAfterFailedBatchApplied: a bucket row verified at its version, then rewritten
// damaged (two entries' ids swapped, the checksum field kept) by a raw Table write whose
// batch failed at the node but reached the store. The row is fetched again; Lookup must not
// trust it by the version it verified: on 446c910 the fetch stamped the row with the durable
// version, which was the verified one, and Lookup returned the swapped ids as data.
func TestFastPathAfterFailedBatchApplied(t *testing.T) {
	ctx := context.Background()
	es, err := store.OpenEmbedded(storenode.Options{Dir: t.TempDir(), Sync: storenode.SyncNone, ExpireLeasesAtOpen: true})
	require.NoError(t, err)
	ls := &faultstore.LostAck{Store: es}
	db, err := txnode.Open(ctx, txnode.Options{Store: ls})
	require.NoError(t, err)
	defer func() { db.Close(ctx) }()
	ix := createIndex(t, ctx, db, "a", hashindex.Options{KeyBytes: 16, Unique: true})
	n := 60
	for i := range n {
		require.NoError(t, ix.Insert(ctx, playerName(i), uint64(i)+1))
	}
	tb := ix.Table()
	row := make([]byte, tb.RowBytes())
	bid := uint64(0)
	for _, id := range rowsOfKind(t, tb, 1) {
		require.NoError(t, tb.Get(ctx, id, row))
		if binary.LittleEndian.Uint16(row[6:]) >= 2 {
			bid = id
			break
		}
	}
	require.NotZero(t, bid, "a bucket row with two entries")
	// The row written last (the same bytes): its version is the durable one.
	require.NoError(t, tb.Put(ctx, bid, row))
	for i := range n { // verified at that version, then fast
		id, err := ix.Lookup(ctx, playerName(i))
		require.NoError(t, err)
		require.Equal(t, uint64(i)+1, id)
	}
	a, b := 24+16, 24+24+16
	ida, idb := binary.LittleEndian.Uint64(row[a:]), binary.LittleEndian.Uint64(row[b:])
	binary.LittleEndian.PutUint64(row[a:], idb)
	binary.LittleEndian.PutUint64(row[b:], ida)
	ls.Armed.Store(true)
	require.ErrorIs(t, tb.Put(ctx, bid, row), faultstore.ErrAckLost)
	for i := range n {
		id, err := ix.Lookup(ctx, playerName(i))
		if err != nil {
			continue // refused after the failure, or the damage found: never data
		}
		require.Equal(t, uint64(i)+1, id, "key %d: another key's id returned as data", i)
	}
}
