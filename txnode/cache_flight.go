package txnode

import (
	"sync/atomic"

	"github.com/weftdb/weft/internal/assert"
)

// The cache's rows in flight: each frame's flight record, the ghosts that frames evicted with
// rows in flight leave, the settled version, and the invalidation of a failed batch's rows.

// frameFlight is a frame's flight record: ver is the highest commit version (WriteBack: the
// epoch's cut) of its rows handed to a commit batch, mask the slots of such rows since the
// last time all of them had settled; ghostVer and ghostMask are what the page's previous
// frames, evicted with rows in flight, left (0 when none, or once settled). Written by the
// pipeline (under its mu, the frame pinned) and by pin (under the cache's mu, for a new
// frame); read by the evictor (under the cache's mu) and by fetch.
type frameFlight struct {
	ver, mask           atomic.Uint64
	ghostVer, ghostMask atomic.Uint64
}

// ghost is what an evicted frame with rows in flight leaves in pageCache.ghosts.
type ghost struct {
	ver, mask uint64
}

// ghostsMin is the ghost count below which the cache does not sweep settled ghosts.
const ghostsMin = 64

// flight returns the flight record of frame m.
func (c *pageCache) flight(m *frameMeta) *frameFlight {
	return &c.chunks[m.frameIdx/metaChunk].Load().flights[m.frameIdx%metaChunk]
}

// markFlight records that the rows of mask of the pinned frame m are handed to a commit batch
// at version ver (the highest so far: callers hand versions in increasing order). Caller
// holds the pipeline's mu (Durable) or flushMu (WriteBack) and a pin on m.
func (c *pageCache) markFlight(m *frameMeta, mask, ver uint64) {
	f := c.flight(m)
	old := f.ver.Load()
	// - Versions in flight only grow per frame: a lower one would let a ghost's fetch wait
	//   for too early a batch, and read the rows before a later batch applied.
	if ver < old {
		assert.Failf("txnode: rows marked in flight at version %d after %d", ver, old)
	}
	if old <= c.settledVer.Load() {
		f.mask.Store(mask) // every earlier row in flight has settled
	} else {
		f.mask.Or(mask)
	}
	f.ver.Store(ver)
}

// ghostOf returns the ghost frame m inherited: a fetch of any slot of mask must first wait
// for every batch through ver to settle. ver is 0 when there is none, or it has settled.
func (c *pageCache) ghostOf(m *frameMeta) (ver, mask uint64) {
	f := c.flight(m)
	v := f.ghostVer.Load()
	if v == 0 || v <= c.settledVer.Load() {
		return 0, 0
	}
	return v, f.ghostMask.Load()
}

// ghostLocked returns what evicting frame m (its key just cleared) leaves behind: its rows
// still in flight and the ghosts it inherited, unless they have settled. Caller holds mu.
func (c *pageCache) ghostLocked(m *frameMeta) (ghost, bool) {
	f := c.flight(m)
	settled := c.settledVer.Load()
	var g ghost
	if v := f.ver.Load(); v > settled {
		g = ghost{ver: v, mask: f.mask.Load()}
	}
	if v := f.ghostVer.Load(); v > settled {
		g = ghost{ver: max(g.ver, v), mask: g.mask | f.ghostMask.Load()}
	}
	return g, g.ver != 0
}

// addGhostLocked records g for key, sweeping settled ghosts when they have doubled. Caller
// holds mu.
func (c *pageCache) addGhostLocked(key uint64, g ghost) {
	if old, ok := c.ghosts[key]; ok {
		g = ghost{ver: max(g.ver, old.ver), mask: g.mask | old.mask}
	} else if len(c.ghosts) >= max(ghostsMin, 2*c.ghostsSwept) {
		settled := c.settledVer.Load()
		for k, x := range c.ghosts {
			if x.ver <= settled {
				delete(c.ghosts, k)
			}
		}
		c.ghostsSwept = len(c.ghosts)
	}
	c.ghosts[key] = g
	c.ghostsMade.Add(1)
}

// takeGhostLocked gives a new frame of key (flight record f) the ghost its page left, if any
// and not settled, and clears the record of the frame's previous page. Caller holds mu.
func (c *pageCache) takeGhostLocked(key uint64, f *frameFlight) {
	f.ver.Store(0)
	f.mask.Store(0)
	g, ok := c.ghosts[key]
	if ok {
		delete(c.ghosts, key)
		if g.ver <= c.settledVer.Load() {
			g = ghost{}
		}
	}
	f.ghostVer.Store(g.ver)
	f.ghostMask.Store(g.mask)
}

// settle advances settledVer to ver (batches through ver have settled) and wakes nobody:
// the pipeline's waiters wait on its own condition. Caller holds the pipeline's mu.
func (c *pageCache) settle(ver uint64) {
	if ver > c.settledVer.Load() {
		c.settledVer.Store(ver)
	}
}

// invalidateRefs drops the cached rows of the frames of a failed batch (valid, and with dirty
// also the WriteBack dirty bits), skipping a frame that holds another page now (evicted and
// given another key: the page's ghost makes its next fetch wait for the failed batch to
// settle). A frame that holds the same page is invalidated, whether or not it was evicted
// and refilled meanwhile (a refill then only reads the store again). Not the generation: an
// eviction the evictor undoes (a pin raced with it) bumps it while the frame keeps its page
// and the batch's rows. Takes mu: the key does not change meanwhile.
func (c *pageCache) invalidateRefs(refs []frameRef, dirty bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range refs {
		if r.m.key.Load() != r.key {
			continue
		}
		r.m.valid.Store(0)
		if dirty {
			r.m.dirty.Store(0)
		}
	}
}

// frameRef names a frame and the page it held when a batch took it (pinned: the key is
// stable then).
type frameRef struct {
	m   *frameMeta
	key uint64
}

func refOf(m *frameMeta) frameRef { return frameRef{m: m, key: m.key.Load()} }
