package hashindex_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/hashindex"
	"github.com/weftdb/weft/storenode"
	"github.com/weftdb/weft/storenode/server"
	"github.com/weftdb/weft/txnode"
)

// TestRemoteStore: the index over a storage node on 127.0.0.1, with a cache too small for
// it (lookups miss, bucket rows are fetched over TCP), across a reopen of the transaction
// node and a restart of the storage node.
func TestRemoteStore(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	start := func() (string, *server.Server) {
		srv, err := server.New(server.Config{Listen: "127.0.0.1:0", Options: storenode.Options{Dir: dir, Sync: storenode.SyncNone}})
		require.NoError(t, err)
		require.NoError(t, srv.Start())
		return srv.Addr().String(), srv
	}
	open := func(addr string, cacheBytes int64) *txnode.DB {
		db, err := txnode.Open(ctx, txnode.Options{StoreAddr: addr, CacheBytes: cacheBytes, OwnerID: 7})
		require.NoError(t, err)
		return db
	}
	addr, srv := start()
	defer func() { srv.Shutdown(ctx) }()
	const small = 144 << 10 // 8 frames of 64 bucket rows with the cache's metadata, the index ~10: lookups miss
	db := open(addr, small)
	defer func() { db.Close(ctx) }()
	ix := createIndex(t, ctx, db, "names", hashindex.Options{KeyBytes: 16, Unique: true})
	n := 3000          // -short too: fewer keys would fit the small cache
	for i := range n { // one transaction each: a split touches up to five pages
		require.NoError(t, ix.Insert(ctx, playerName(i), uint64(i)))
	}
	for i := 0; i < n; i += 3 {
		require.NoError(t, ix.Delete(ctx, playerName(i), uint64(i)))
	}
	check := func(ix *hashindex.Index, verify bool) {
		for i := range n {
			id, err := ix.Lookup(ctx, playerName(i))
			if i%3 == 0 {
				require.ErrorIs(t, err, hashindex.ErrNotFound)
				continue
			}
			require.NoError(t, err, "key %d", i)
			require.Equal(t, uint64(i), id)
		}
		require.ErrorIs(t, ix.Insert(ctx, playerName(1), 5), hashindex.ErrUniqueViolation)
		if !verify {
			return
		}
		st := verifyIndex(t, ctx, ix)
		require.Equal(t, n-(n+2)/3, st.Entries)
	}
	check(ix, false)
	before := db.Stats().PageMisses
	for i := range 200 {
		ix.Lookup(ctx, playerName(i))
	}
	require.Greater(t, db.Stats().PageMisses, before, "the cache holds the whole index")

	require.NoError(t, db.Close(ctx))
	db = open(addr, 4<<20) // Verify reads the whole index in one transaction
	var err error
	ix, err = hashindex.Open(ctx, db, "names")
	require.NoError(t, err)
	check(ix, true)

	require.NoError(t, db.Close(ctx))
	require.NoError(t, srv.Shutdown(ctx))
	addr, srv = start()
	db = open(addr, small)
	ix, err = hashindex.Open(ctx, db, "names")
	require.NoError(t, err)
	check(ix, false)
}
