package txnode

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// Sequential readers are told apart: 16 readers, each reading its own 4 pages row by row,
// their Gets interleaved, fetch whole pages after their first two misses, as one reader does
// alone. With one last-miss page per table (before), every interleaved Get missed and fetched
// its one row: 4096 misses instead of about 16*5. Fails on b25b6d9.
func TestInterleavedSequentialReaders(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	const streams, pages = 16, 4
	{
		db := openDB(t, ctx, Options{Dir: dir, SyncMode: "none"})
		tb := newTable(t, ctx, db, "seq", 64)
		insertRows(t, db, tb, streams*pages*64)
		require.NoError(t, db.Close(ctx))
	}
	db, err := Open(ctx, Options{Dir: dir, SyncMode: "none"}) // a cold cache
	require.NoError(t, err)
	defer db.Close(ctx)
	tb := openTable(t, ctx, db, "seq")
	buf := make([]byte, 64)
	before := db.Stats().PageMisses
	for i := range uint64(pages * 64) {
		for s := range uint64(streams) {
			id := s*pages*64 + i
			require.NoError(t, tb.Get(ctx, id, buf))
			require.Equal(t, u64Row(64, id), buf)
		}
	}
	misses := db.Stats().PageMisses - before
	t.Logf("%d misses for %d interleaved readers of %d pages", misses, streams, pages)
	require.LessOrEqual(t, misses, uint64(streams*(pages+1)), "each reader: two misses in its first page, one in each next")
}
