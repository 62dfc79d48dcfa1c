package txnode

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fillTable inserts pages*64 rows (row i holds value base+i) and returns their ids.
func fillTable(t *testing.T, ctx context.Context, db *DB, tb *Table, pages int, base uint64) []uint64 {
	t.Helper()
	var ids []uint64
	for p := range pages {
		require.NoError(t, db.Update(ctx, func(tx *Tx) error {
			ids = ids[:p*64]
			for i := range 64 {
				id, err := tx.Insert(tb, u64Row(tb.RowBytes(), base+uint64(p*64+i)))
				if err != nil {
					return err
				}
				ids = append(ids, id)
			}
			return nil
		}))
	}
	require.NoError(t, db.pipe.flush(ctx))
	return ids
}

// TestTablePinSurvivesScan: a pinned table's pages stay cached through a scan (and random
// reads) of a table several times the cache; every read of them afterwards is a hit. The
// same sequence without the pin misses (so the test can fail).
func TestTablePinSurvivesScan(t *testing.T) {
	eachConfig(t, openConfigs(t), Options{CacheBytes: 256 << 10, CacheWait: time.Second}, func(t *testing.T, db *DB) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		zone := newTable(t, ctx, db, "zone", 64)
		big := newTable(t, ctx, db, "big", 64)
		zoneIDs := fillTable(t, ctx, db, zone, 8, 0)
		fillTable(t, ctx, db, big, 150, 1<<20) // ~3 times the cache

		buf := make([]byte, 64)
		sweep := func() {
			n := 0
			for _, err := range big.Scan(ctx, 0, ^uint64(0)) {
				require.NoError(t, err)
				n++
			}
			require.Equal(t, 150*64, n)
			rng := rand.New(rand.NewPCG(1, 2))
			for range 500 {
				err := big.Get(ctx, rng.Uint64N(150*64), buf)
				if err != nil {
					require.ErrorIs(t, err, ErrNotFound) // ids are the store's, not 0..n
				}
			}
		}
		readZone := func() {
			for i, id := range zoneIDs {
				require.NoError(t, zone.Get(ctx, id, buf))
				require.Equal(t, uint64(i), checkRow(t, buf))
			}
		}

		require.NoError(t, zone.Pin(ctx))
		st := zone.Stats()
		require.True(t, st.Pinned)
		// Every page below the id high-water mark (the store's grants: 1+2+4+8 pages).
		pages := int((zone.t.idHigh.Load() + 63) / 64)
		require.Equal(t, 15, pages)
		require.Equal(t, pages, st.PinnedPages)
		require.Equal(t, int64(pages)*frameCost(64), st.PinnedBytes)
		require.Equal(t, int64(pages)*frameCost(64), db.Stats().PinnedBytes)
		ev := db.Stats().Evictions
		sweep()
		require.Greater(t, db.Stats().Evictions, ev+100, "the sweep evicted")
		before := zone.Stats()
		readZone()
		after := zone.Stats()
		require.Equal(t, before.Misses, after.Misses, "a pinned page was evicted")
		require.Equal(t, before.Hits+uint64(len(zoneIDs)), after.Hits)
		require.LessOrEqual(t, db.Stats().CacheBytes, int64(256<<10))

		zone.Unpin()
		require.False(t, zone.Stats().Pinned)
		require.Zero(t, db.Stats().PinnedBytes)
		sweep()
		before = zone.Stats()
		readZone()
		require.Greater(t, zone.Stats().Misses, before.Misses, "unpinned, the sweep evicts the zone")
	})
}

// TestTablePinBudget: a pin past Options.PinBytes fails with ErrPinBudget and pins nothing;
// pages gained beyond it stay evictable (PinOverflow); Unpin gives the budget back; Open
// refuses a budget over three quarters of the cache.
func TestTablePinBudget(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg := openConfigs(t)[0]
	open := cfg.opener(t)
	_, err := Open(ctx, Options{Dir: t.TempDir(), CacheBytes: 1 << 20, PinBytes: 1<<20*3/4 + 1})
	require.ErrorContains(t, err, "PinBytes")

	cost := frameCost(64)
	db := open(Options{CacheBytes: 1 << 20, PinBytes: 4 * cost})
	a := newTable(t, ctx, db, "a", 64)
	b := newTable(t, ctx, db, "b", 64)
	c := newTable(t, ctx, db, "c", 64)
	fillTable(t, ctx, db, a, 8, 0)
	fillTable(t, ctx, db, b, 2, 0)
	fillTable(t, ctx, db, c, 2, 0)
	// Pin holds every page below the id high-water mark: the store's id grants (1 page,
	// then 2: three pages for two of rows).
	hiPages := func(tb *Table) int { return int((tb.t.idHigh.Load() + 63) / 64) }
	require.Equal(t, 3, hiPages(b))
	require.Equal(t, 3, hiPages(c))

	require.ErrorIs(t, a.Pin(ctx), ErrPinBudget) // 8 pages > 4
	require.False(t, a.Stats().Pinned)
	require.Zero(t, db.Stats().PinnedBytes)
	require.NoError(t, b.Pin(ctx))
	require.NoError(t, b.Pin(ctx)) // a no-op
	require.Equal(t, 3*cost, db.Stats().PinnedBytes)
	require.ErrorIs(t, c.Pin(ctx), ErrPinBudget) // 3 + 3 > 4
	require.False(t, c.Stats().Pinned)
	require.Equal(t, 3*cost, db.Stats().PinnedBytes)

	// b's inserts make pages 3 and 4: one fits the budget, one overflows.
	fillTable(t, ctx, db, b, 3, 100)
	st := b.Stats()
	require.Equal(t, 4, st.PinnedPages)
	require.Equal(t, uint64(1), st.PinOverflow)
	require.Equal(t, 4*cost, db.Stats().PinnedBytes)

	b.Unpin()
	b.Unpin() // a no-op
	require.Zero(t, db.Stats().PinnedBytes)
	require.NoError(t, c.Pin(ctx))
	require.Equal(t, 3, c.Stats().PinnedPages)

	// A dropped table's pin is released with it.
	require.NoError(t, db.DropTable(ctx, "c"))
	require.Zero(t, db.Stats().PinnedBytes)
	require.Error(t, c.Pin(ctx))

	// No budget at all.
	db2 := cfg.opener(t)(Options{CacheBytes: 1 << 20, PinBytes: -1})
	b2 := newTable(t, ctx, db2, "b", 64)
	require.ErrorIs(t, b2.Pin(ctx), ErrPinBudget)
}

// TestTableStatsExact counts hits and misses of a known sequence on a cold cache.
func TestTableStatsExact(t *testing.T) {
	for _, cfg := range openConfigs(t) {
		t.Run(cfg.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			open := cfg.opener(t)
			db := open(Options{})
			tb := newTable(t, ctx, db, "t", 64)
			other := newTable(t, ctx, db, "o", 64)
			ids := fillTable(t, ctx, db, tb, 1, 0)
			fillTable(t, ctx, db, other, 1, 0)
			require.NoError(t, db.Close(ctx))

			db = open(Options{}) // a cold cache
			tb = openTable(t, ctx, db, "t")
			other = openTable(t, ctx, db, "o")
			buf := make([]byte, 64)
			want := func(hits, misses uint64) {
				t.Helper()
				st := tb.Stats()
				require.Equal(t, hits, st.Hits, "hits")
				require.Equal(t, misses, st.Misses, "misses")
			}
			want(0, 0)
			require.NoError(t, tb.Get(ctx, ids[0], buf)) // a miss: one row fetched
			want(0, 1)
			require.NoError(t, tb.Get(ctx, ids[0], buf)) // the lock-free path
			want(1, 1)
			require.NoError(t, db.View(ctx, func(tx *Tx) error { return tx.Get(tb, ids[0], buf) }))
			want(2, 1)
			require.NoError(t, tb.Get(ctx, ids[1], buf)) // a second miss in the page: all of it
			want(2, 2)
			require.NoError(t, tb.Get(ctx, ids[2], buf))
			require.NoError(t, tb.Update(ctx, ids[3], func([]byte) error { return nil }))
			want(4, 2)
			require.Equal(t, 4.0/6, tb.Stats().HitRate())
			require.Zero(t, other.Stats().Hits+other.Stats().Misses, "another table's reads")
			s := db.Stats()
			require.Equal(t, uint64(2), s.RowHits, "the DB's lock-free hits")
			require.Equal(t, uint64(2), s.PageMisses)

			require.NoError(t, other.Get(ctx, 0, buf))
			require.NoError(t, db.DropTable(ctx, "o"))
			require.Equal(t, uint64(2), db.Stats().RowHits, "a dropped table's hits stay counted")
			require.NoError(t, tb.Get(ctx, ids[0], buf))
			require.Equal(t, uint64(3), db.Stats().RowHits)
		})
	}
}
