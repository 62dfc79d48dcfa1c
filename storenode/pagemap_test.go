package storenode

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/weftdb/weft/internal/testseed"
)

// editEntry replaces *pm with a version whose entry of page fn changed (tests that damage a
// meta file's page map).
func editEntry(pm **pageMap, page uint64, fn func(*mapEntry)) {
	ent := (*pm).get(page)
	fn(&ent)
	c := (*pm).edit()
	c.set(page, ent)
	*pm = c.seal()
}

// The page map against a Go map: sets and removals at random pages (clustered and spread up
// to the page limit), versions that share nodes and stay unchanged, ranks, iteration order.
func TestPageMapModel(t *testing.T) {
	seed, _ := testseed.Replay(t)
	rng := rand.New(rand.NewPCG(seed, 13))
	var pm *pageMap
	model := map[uint64]mapEntry{}
	type version struct {
		pm    *pageMap
		model map[uint64]mapEntry
	}
	var versions []version
	pageOf := func() uint64 {
		switch rng.IntN(4) {
		case 0:
			return rng.Uint64N(tablePagesMax)
		case 1:
			return tablePagesMax - 1 - rng.Uint64N(200)
		default:
			return rng.Uint64N(300)
		}
	}
	for round := range testseed.Scaled(30, 200, 2000) {
		ed := pm.edit()
		for range rng.IntN(50) {
			page := pageOf()
			var ent mapEntry
			if rng.IntN(3) > 0 {
				ent = mapEntry{disk: uint32(rng.Uint32N(1000)), crc: rng.Uint32(), lsn: uint64(round), present: rng.Uint64()}
			}
			ed.set(page, ent)
			if ent == (mapEntry{}) {
				delete(model, page)
			} else {
				model[page] = ent
			}
		}
		pm = ed.seal()
		snap := make(map[uint64]mapEntry, len(model))
		for k, v := range model {
			snap[k] = v
		}
		versions = append(versions, version{pm, snap})
	}
	for i, v := range versions {
		require.Equal(t, len(v.model), v.pm.count(), "version %d", i)
		var prev uint64
		n, leaves, lastLeaf := 0, 0, ^uint64(0)
		for page, ent := range v.pm.all() {
			require.True(t, n == 0 || page > prev, "ascending")
			require.Equal(t, v.model[page], ent, "version %d page %d", i, page)
			l, e := v.pm.rank(page)
			if page/64 != lastLeaf {
				leaves++
				lastLeaf = page / 64
			}
			require.Equal(t, n, e, "entries before page %d", page)
			require.Equal(t, leaves-1, l, "leaves before page %d", page)
			prev = page
			n++
		}
		require.Equal(t, len(v.model), n)
		require.Equal(t, leaves, v.pm.leafCount())
		for page, ent := range v.model {
			require.Equal(t, ent, v.pm.get(page))
		}
		require.Equal(t, mapEntry{}, v.pm.get(tablePagesMax-1-300), "a page never set")
	}
}

// A sealed map refuses set.
func TestPageMapSealed(t *testing.T) {
	pm := (*pageMap)(nil).edit()
	pm.set(3, mapEntry{disk: 1})
	pm.seal()
	require.Panics(t, func() { pm.set(4, mapEntry{disk: 2}) })
}
