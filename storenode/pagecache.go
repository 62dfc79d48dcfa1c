package storenode

import (
	"github.com/weftdb/weft/internal/assert"
	"github.com/weftdb/weft/logicpage"
)

// The disk page cache: logical pages of every table, in frames carved from slabs (one per page
// size) that hold no Go pointers, indexed by a per-table radix tree over page numbers (pageindex.go), evicted by CLOCK.
//
// Invariants (all under Engine.mu, which guards the cache; the cache has no lock of its own):
//   - usedBytes = sum over live frames of (page bytes + frameOverheadBytes), and
//     usedBytes + index.bytes (the page index's nodes, pageindex.go) <= budgetBytes,
//     except while one batch larger than the whole budget is applied (alloc with force), which a
//     checkpoint then writes out.
//   - A frame's valid mask says which slots' bytes are authoritative. A frame created by a
//     commit to a page not in the cache is partial (no read before write): its other slots are
//     merged from the disk copy at checkpoint or on first read. Absent slots are zero.
//   - A dirty frame (changes not yet in a published checkpoint), a loading frame (disk read in
//     flight) and a pinned frame are never evicted.
//   - The present mask is not kept here: the table's bitmap-tree is the authority on which rows
//     exist, for cached and uncached pages alike.

// frameOverheadBytes is what one frame costs beside its rows: metadata and index entry,
// rounded up; it counts against the budget so a cache of tiny pages still keeps its bound.
const frameOverheadBytes = 128

// frameKey packs (table, page); table ids start at 1, so key 0 means "free frame".
func frameKey(table uint32, page uint64) uint64 { return uint64(table)<<32 | page }

type frame struct {
	key     uint64
	valid   uint64 // slots whose bytes are authoritative
	lsn     uint64 // highest LSN applied to the frame
	copied  uint64 // lsn when the running checkpoint copied it; clean after publish if unchanged
	slot    int32  // index in its slab
	class   int16  // index of its slab in pageCache.slabs
	dirty   bool
	ref     bool // CLOCK reference bit
	loading bool
	pins    int32
}

type slab struct {
	pageBytes int
	perChunk  int
	chunks    [][]byte // each perChunk*pageBytes, 8-byte aligned
	free      []int32
	next      int32
}

func (s *slab) get() int32 {
	if n := len(s.free); n > 0 {
		id := s.free[n-1]
		s.free = s.free[:n-1]
		return id
	}
	id := s.next
	s.next++
	if int(id)/s.perChunk >= len(s.chunks) {
		s.chunks = append(s.chunks, logicpage.AlignedBytes(s.perChunk*s.pageBytes))
	}
	return id
}

func (s *slab) bytes(id int32) []byte {
	c, off := int(id)/s.perChunk, (int(id)%s.perChunk)*s.pageBytes
	return s.chunks[c][off : off+s.pageBytes : off+s.pageBytes]
}

type pageCache struct {
	budgetBytes  int64
	usedBytes    int64
	frames       []frame
	freeIDs      []int32
	index        pageIndex
	slabs        []*slab
	hand         int
	dirtyFrames  int
	dirtyBytes   int64
	allocBytes   int64 // cumulative cost of the frames alloc handed out (the checkpoint trigger's demand)
	dirtiedBytes int64 // cumulative cost of the frames markDirty turned dirty (likewise)
	hits         uint64
	misses       uint64
}

func newPageCache(budgetBytes int64) *pageCache {
	return &pageCache{budgetBytes: budgetBytes, index: newPageIndex()}
}

func (c *pageCache) lookup(key uint64) (int32, bool) {
	return c.index.get(key)
}

func (c *pageCache) frameCost(pageBytes int) int64 { return int64(pageBytes) + frameOverheadBytes }

func (c *pageCache) slabFor(pageBytes int) int16 {
	for i, s := range c.slabs {
		if s.pageBytes == pageBytes {
			return int16(i)
		}
	}
	per := max(1, (1<<20)/pageBytes)
	c.slabs = append(c.slabs, &slab{pageBytes: pageBytes, perChunk: per})
	return int16(len(c.slabs) - 1)
}

// alloc returns a new empty frame (valid 0, clean) for key, evicting clean frames by CLOCK to
// stay within the budget. It fails when nothing can be evicted, unless force, which lets one
// oversized batch exceed the budget.
func (c *pageCache) alloc(key uint64, pageBytes int, force bool) (int32, bool) {
	cost := c.frameCost(pageBytes)
	for c.usedBytes+c.index.bytes+cost+c.index.growth(key) > c.budgetBytes {
		if !c.evictOne() {
			if !force {
				return 0, false
			}
			break
		}
	}
	var id int32
	if n := len(c.freeIDs); n > 0 {
		id = c.freeIDs[n-1]
		c.freeIDs = c.freeIDs[:n-1]
	} else {
		c.frames = append(c.frames, frame{})
		id = int32(len(c.frames) - 1)
	}
	class := c.slabFor(pageBytes)
	c.frames[id] = frame{key: key, class: class, slot: c.slabs[class].get(), ref: true}
	clear(c.rows(id))
	c.index.set(key, id)
	c.usedBytes += cost
	c.allocBytes += cost
	return id, true
}

// evictOne drops one clean, unpinned, not loading frame, giving recently used frames a second
// chance. It reports false when no frame can be evicted.
func (c *pageCache) evictOne() bool {
	n := len(c.frames)
	for range 2 * n {
		if c.hand >= n {
			c.hand = 0
		}
		f := &c.frames[c.hand]
		c.hand++
		if f.key == 0 || f.dirty || f.loading || f.pins > 0 {
			continue
		}
		if f.ref {
			f.ref = false
			continue
		}
		c.drop(int32(c.hand - 1))
		return true
	}
	return false
}

// drop removes a frame whatever its state (eviction, dropped table).
func (c *pageCache) drop(id int32) {
	f := &c.frames[id]
	if f.key == 0 {
		assert.Failf("storenode: drop of free frame %d", id)
	}
	s := c.slabs[f.class]
	if f.dirty {
		c.dirtyFrames--
		c.dirtyBytes -= c.frameCost(s.pageBytes)
	}
	c.index.del(f.key)
	s.free = append(s.free, f.slot)
	c.usedBytes -= c.frameCost(s.pageBytes)
	*f = frame{}
	c.freeIDs = append(c.freeIDs, id)
}

func (c *pageCache) rows(id int32) []byte {
	f := &c.frames[id]
	return c.slabs[f.class].bytes(f.slot)
}

func (c *pageCache) markDirty(id int32, lsn uint64) {
	f := &c.frames[id]
	if !f.dirty {
		f.dirty = true
		c.dirtyFrames++
		cost := c.frameCost(c.slabs[f.class].pageBytes)
		c.dirtyBytes += cost
		c.dirtiedBytes += cost
	}
	f.lsn = lsn
	f.ref = true
}

func (c *pageCache) markClean(id int32) {
	f := &c.frames[id]
	if f.dirty {
		f.dirty = false
		c.dirtyFrames--
		c.dirtyBytes -= c.frameCost(c.slabs[f.class].pageBytes)
	}
}
