package storenode

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/weftdb/weft/internal/vfs"
	"github.com/weftdb/weft/logicpage"
)

// TestPageIndexModel drives the radix page index with random inserts and deletes over three
// tables, dense and sparse pages (up to the last page of the 2^30 range), against a map, and
// checks lookups, counts, per-table frame lists and that emptied nodes and tables are freed.
func TestPageIndexModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	x := newPageIndex()
	model := map[uint64]int32{}
	pageOf := func() uint64 {
		switch rng.IntN(4) {
		case 0:
			return pixPages - 1 - rng.Uint64N(3)
		case 1:
			return rng.Uint64N(pixPages)
		default:
			return rng.Uint64N(3000)
		}
	}
	steps := 20000
	if testing.Short() {
		steps = 5000
	}
	next := int32(0)
	for step := range steps {
		key := frameKey(uint32(1+rng.IntN(3)), pageOf())
		id, ok := x.get(key)
		want, wantOK := model[key]
		require.Equal(t, wantOK, ok, "key %#x", key)
		if ok {
			require.Equal(t, want, id, "key %#x", key)
		}
		if ok && rng.IntN(2) == 0 || !ok && len(model) > 400 {
			if ok {
				x.del(key)
				delete(model, key)
			}
		} else if !ok {
			before, grows := x.bytes, x.growth(key)
			x.set(key, next)
			require.Equal(t, before+grows, x.bytes, "growth predicts what set allocates, key %#x", key)
			model[key] = next
			next++
		}
		if step%500 == 0 {
			n, err := x.verify()
			require.NoError(t, err)
			require.Equal(t, len(model), n)
			require.Equal(t, len(model), x.n)
			for tid := uint32(1); tid <= 3; tid++ {
				var want []int32
				for k, id := range model {
					if uint32(k>>32) == tid {
						want = append(want, id)
					}
				}
				got := x.tableFrames(tid, nil)
				slices.Sort(got)
				slices.Sort(want)
				require.Equal(t, want, got, "table %d", tid)
			}
		}
	}
	_, ok := x.get(frameKey(1, pixPages))
	require.False(t, ok, "a page beyond the index is never cached")
	for key := range model {
		x.del(key)
	}
	n, err := x.verify()
	require.NoError(t, err)
	require.Zero(t, n)
	require.Empty(t, x.tables, "empty tables are freed with their nodes")
	require.Zero(t, x.bytes, "freed nodes are uncharged")
	require.Nil(t, x.last)
}

// BenchmarkPageIndexGet measures random lookups of cached pages in the radix index against
// the Go map it replaced (map=1), at a 300K-, 3M- and 30M-row table of 64-row pages.
func BenchmarkPageIndexGet(b *testing.B) {
	for _, pages := range []uint64{4_688, 46_875, 468_750} {
		for _, useMap := range []bool{false, true} {
			b.Run(fmt.Sprintf("pages=%d/map=%v", pages, useMap), func(b *testing.B) {
				x := newPageIndex()
				m := make(map[uint64]int32)
				for p := range pages {
					x.set(frameKey(1, p), int32(p))
					m[frameKey(1, p)] = int32(p)
				}
				keys := make([]uint64, 1<<16)
				rng := rand.New(rand.NewPCG(1, pages))
				for i := range keys {
					keys[i] = frameKey(1, rng.Uint64N(pages))
				}
				var sum int32
				i := 0
				for b.Loop() {
					k := keys[i&(len(keys)-1)]
					i++
					if useMap {
						sum += m[k]
					} else {
						id, _ := x.get(k)
						sum += id
					}
				}
				if sum == -1 {
					b.Log(sum)
				}
			})
		}
	}
}

// pageIndexWalkBytes is the bytes of x's nodes, found by walking them (what x.bytes must say).
func pageIndexWalkBytes(x *pageIndex) int64 {
	var b int64
	for _, t := range x.tables {
		b += pixTableBytes + int64(cap(t.root))*pixPtrBytes
		for _, m := range t.root {
			if m == nil {
				continue
			}
			b += pixMidBytes + int64(cap(m.leaves))*pixSlotBytes
			for _, l := range m.leaves {
				if l != nil {
					b += pixLeafBytes
				}
			}
		}
	}
	return b
}

// TestPageIndexChargedToBudget writes and then reads one page per million of a table (each
// frame in its own leaf and middle node, the index's sparsest case) through a small cache: the
// frames and the index's nodes together stay within the budget, and Stats counts both.
func TestPageIndexChargedToBudget(t *testing.T) {
	const budget = 64 << 10 // about 15 frames of 4 KiB pages
	const spread = 40       // pages k<<20, k < spread
	fs := vfs.NewFaultFS()
	e := openEngine(t, Options{Dir: "db", FS: fs, Logger: quietLogger, CacheBytes: budget})
	defer e.Close()
	info, err := e.CreateTable("sparse", 64)
	require.NoError(t, err)
	g := acquire(t, e, info.ID, testOwner, 0)
	for granted := uint64(0); granted < spread<<20; granted += idPagesPerGrantMax {
		_, _, err := e.AllocIDs(info.ID, testOwner, g.Epoch, idPagesPerGrantMax)
		require.NoError(t, err)
	}
	check := func(what string) {
		e.mu.Lock()
		walked, used, counted := pageIndexWalkBytes(&e.cache.index), e.cache.usedBytes, e.cache.index.bytes
		e.mu.Unlock()
		require.Equal(t, walked, counted, "%s: the index counts its bytes", what)
		require.LessOrEqual(t, used+walked, int64(budget), "%s: frames %d bytes, index %d bytes", what, used, walked)
		require.Equal(t, used+walked, e.Stats().CacheBytes, "%s: Stats counts the index", what)
	}
	for k := range uint64(spread) {
		id := k << 20 * logicpage.RowsPerPage
		commitWait(t, e, batchOf(testOwner, k+1, info.ID, g.Epoch, oneRow(info.ID, id, row64(id))))
		check(fmt.Sprintf("commit %d", k))
	}
	require.NoError(t, e.Checkpoint())
	for k := range uint64(spread) {
		id := k << 20 * logicpage.RowsPerPage
		row, ok := readRow(t, e, info.ID, id)
		require.True(t, ok)
		require.Equal(t, row64(id), row)
		check(fmt.Sprintf("read %d", k))
	}
	require.NoError(t, e.verify())
	// A drop frees the table's nodes and forgets it as the last table looked up.
	require.NoError(t, e.DropTable("sparse", testOwner))
	e.mu.Lock()
	require.Zero(t, e.cache.index.bytes)
	require.Empty(t, e.cache.index.tables)
	require.Nil(t, e.cache.index.last)
	e.mu.Unlock()
	require.NoError(t, e.verify())
}
